"""The VeRL platform for TorchTPU, exercised with a fake torch_tpu (no TPU here:
not verified on TPU hardware)."""

from __future__ import annotations

import importlib
import sys
import types

import pytest


@pytest.fixture
def fake_torch_tpu(monkeypatch):
    import torch

    calls = []

    def internal():  # torch-tpu 0.2.0: the legacy device queries raise unless a variable allows them
        raise RuntimeError("is_available is internal to TorchTPU ... Use torch.accelerator.is_available instead")

    tpu = types.SimpleNamespace(
        is_available=internal, device_count=internal,
        manual_seed=lambda s: calls.append(("seed", s)), manual_seed_all=lambda s: calls.append(("seed_all", s)),
        empty_cache=lambda: calls.append(("empty",)))
    acc = torch.accelerator
    monkeypatch.setattr(acc, "is_available", lambda: True)
    monkeypatch.setattr(acc, "current_accelerator", lambda *a, **k: types.SimpleNamespace(type="tpu"))
    monkeypatch.setattr(acc, "device_count", lambda: 4)
    monkeypatch.setattr(acc, "current_device_index", lambda: 0)
    monkeypatch.setattr(acc, "set_device_index", lambda i: calls.append(("set_device", i)))
    monkeypatch.setattr(acc, "synchronize", lambda *a: calls.append(("sync",)))
    mod = types.ModuleType("torch_tpu")
    mod.__spec__ = importlib.machinery.ModuleSpec("torch_tpu", loader=None)
    monkeypatch.setitem(sys.modules, "torch_tpu", mod)
    monkeypatch.setattr(torch, "tpu", tpu, raising=False)
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5e-8")
    sys.modules.pop("tpu_pipeline.rl.tpu_platform", None)
    yield calls
    sys.modules.pop("tpu_pipeline.rl.tpu_platform", None)
    from verl.plugin.platform import PlatformRegistry

    PlatformRegistry._platforms.pop("tpu", None)


def test_registers_only_where_torch_tpu_exists(monkeypatch):
    from verl.plugin.platform import PlatformRegistry

    PlatformRegistry._platforms.pop("tpu", None)
    sys.modules.pop("tpu_pipeline.rl.tpu_platform", None)
    importlib.import_module("tpu_pipeline.rl.tpu_platform")
    assert PlatformRegistry.get("tpu") is None  # no torch_tpu here
    sys.modules.pop("tpu_pipeline.rl.tpu_platform", None)


def test_platform_with_fake_torch_tpu(fake_torch_tpu, monkeypatch):
    from verl.plugin.platform import PlatformBase, PlatformRegistry

    importlib.import_module("tpu_pipeline.rl.tpu_platform")
    cls = PlatformRegistry.get("tpu")
    assert cls is not None and issubclass(cls, PlatformBase)
    p = cls()
    assert p.device_name == "tpu" and p.vendor_name == "google"
    assert p.is_available() and p.is_platform_available(use_smi_check=True)
    assert p.device_count() == 4 and p.current_device() == 0
    assert p.ray_resource_name() == "TPU"
    assert p.ray_resource_options(2) == {"resources": {"TPU": 2}}
    assert p.visible_devices_envvar() == "TPU_VISIBLE_CHIPS"
    assert p.communication_backend_name() == "gloo"  # the fake registers no "tpu_dist" process-group backend
    p.synchronize()
    assert ("sync",) in fake_torch_tpu
    monkeypatch.setenv("TPU_PIPELINE_TPU_DIST_BACKEND", "xla")
    assert p.communication_backend_name() == "xla"
    p.set_device(1)
    p.manual_seed(7)
    with p.nvtx_range("x"):
        pass
    assert ("set_device", 1) in fake_torch_tpu and ("seed", 7) in fake_torch_tpu
    monkeypatch.setenv("VERL_PLATFORM", "tpu")
    from verl.plugin.platform import platform_manager

    assert platform_manager._create_platform("tpu").device_name == "tpu"


def test_verl_engine_on_tpu_host_loads_the_plugin_in_workers(tmp_path):
    from tpu_pipeline.rl.recipe import load_recipe
    from tpu_pipeline.rl.verl_bridge import compose, hydra_overrides

    ov = hydra_overrides(load_recipe("grpo_math"), train_file=tmp_path / "t", val_file=tmp_path / "v",
                         policy_path="/p", out=tmp_path, device="tpu")
    c = compose(ov)
    assert c.trainer.device == "tpu"
    assert c.actor_rollout_ref.model.external_lib == "tpu_pipeline.rl.tpu_platform"
