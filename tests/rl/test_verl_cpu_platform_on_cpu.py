"""The CPU platform VeRL's trainer runs on here (tpu_pipeline.rl.verl_cpu_platform):
registered through VeRL's own external-module hook, the torch.cuda-like device
module, and each VeRL internal it wraps or relies on, checked in the trainer's
own venv (.venv-verl) so a VeRL upgrade that moves one fails here."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest
import torch


def test_device_index_is_a_cpu_device_that_formats_as_0():
    from tpu_pipeline.rl.verl_cpu_platform import CPU_DEVICE, CpuIndex

    i = CPU_DEVICE.current_device()
    assert isinstance(i, CpuIndex)
    assert torch.zeros(1).to(i).device.type == "cpu" and torch.empty(1, device=i).device.type == "cpu"
    assert f"cpu:{i}" == "cpu:0" and torch.device(f"cpu:{i}").type == "cpu"
    free, total = CPU_DEVICE.mem_get_info()
    assert 0 < free <= total
    state = CPU_DEVICE.get_rng_state()
    a = torch.rand(3)
    CPU_DEVICE.set_rng_state(state)
    assert torch.equal(a, torch.rand(3))
    with pytest.raises(AttributeError, match="no 'no_such_call'"):
        CPU_DEVICE.no_such_call


def test_registered_only_when_asked_for(monkeypatch):
    import importlib
    import sys

    from verl.plugin.platform import PlatformBase, PlatformRegistry

    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    PlatformRegistry._platforms.pop("cpu", None)
    sys.modules.pop("tpu_pipeline.rl.verl_cpu_platform", None)
    mod = importlib.import_module("tpu_pipeline.rl.verl_cpu_platform")
    assert PlatformRegistry.get("cpu") is None  # importing it changes nothing on another platform
    cls = mod.register()
    try:
        assert issubclass(cls, PlatformBase) and PlatformRegistry.get("cpu") is cls
        p = cls()
        assert not p.is_platform_available(use_smi_check=True)  # never auto-detected over a GPU
        monkeypatch.setenv("VERL_PLATFORM", "cpu")
        assert p.is_platform_available(use_smi_check=True)
        assert p.device_name == "cpu" and p.communication_backend_name() == "gloo"
        assert p.ray_resource_name() == "GPU" and p.ray_resource_options(1) == {"num_gpus": 1}
        assert p.rollout_env_vars() == {"VLLM_TARGET_DEVICE": "cpu"} and p.is_ipc_supported() is False
    finally:
        PlatformRegistry._platforms.pop("cpu", None)
        sys.modules.pop("tpu_pipeline.rl.verl_cpu_platform", None)


PROBE = textwrap.dedent("""
    import importlib, json, os, sys
    import torch.distributed as dist
    import verl  # loads the plugin through VERL_USE_EXTERNAL_MODULES
    from verl.plugin.platform import get_platform
    from tpu_pipeline.rl import verl_cpu_platform as plugin

    out = {"platform": get_platform().device_name, "missing": []}
    for spec in plugin.WRAPPED:
        mod, attr = spec.split(":")
        obj = importlib.import_module(mod)
        for part in attr.split("."):
            obj = getattr(obj, part, None)
        if obj is None:
            out["missing"].append(spec)
    # wrapper 1: VeRL's own process-group init, world size 1, over the wrapped backend string
    from verl.utils.distributed import initialize_global_process_group_ray
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
    initialize_global_process_group_ray(timeout_second=60)
    out["backend"] = str(dist.get_backend())
    dist.destroy_process_group()
    # 2: the FSDP engine VeRL picks for this platform (VERL_ENGINE_DEVICE=cuda from the plugin's ENV)
    from verl.workers.engine import EngineRegistry
    out["engine"] = EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__
    # 3: the vLLM worker extension the CPU overrides name subclasses VeRL's
    from tpu_pipeline.rl.verl_cpu_vllm import CpuWorkerExtension
    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension
    out["extension"] = issubclass(CpuWorkerExtension, vLLMColocateWorkerExtension)
    import verl.third_party.vllm as tv  # VeRL's version gate reads the `vllm` record
    out["vllm_version"] = tv.vllm_version
    # 4: the rollout the trainer's worker builds is ours, its weight socket in the run's temporary folder
    from verl.workers.rollout.base import get_rollout_class
    out["rollout"] = get_rollout_class("vllm").__module__ + "." + get_rollout_class("vllm").__name__
    out["called"] = sorted(plugin.CALLED)
    print("PROBE" + json.dumps(out))
""")


@pytest.mark.slow
def test_verl_internals_the_plugin_wraps_exist_and_work(verl_python):
    from tpu_pipeline.rl import verl_cpu_platform as plugin
    from tpu_pipeline.rl.verl_cpu_platform import ENV

    port = str(29500 + os.getpid() % 1000)
    p = subprocess.run([verl_python, "-c", PROBE, port], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **ENV})
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("PROBE")), None)
    assert line, p.stderr[-3000:]
    out = json.loads(line[5:])
    assert out["missing"] == []
    assert out["platform"] == "cpu"
    assert out["backend"] == "gloo"
    assert out["engine"].startswith("FSDPEngine")
    assert out["extension"] is True
    assert out["vllm_version"] and "+cpu" in out["vllm_version"]
    assert "wrap.initialize_global_process_group_ray" in out["called"]
    assert out["rollout"] == plugin.CPU_ROLLOUT


def test_the_weight_socket_moves_into_the_runs_own_temporary_folder(private_tmp):
    # two local Ray clusters both number their first job 01000000: in /tmp their sockets were one
    from tpu_pipeline.rl.verl_cpu_platform import private_ipc

    handle = "ipc:///tmp/rl-colocate-zmq-01000000-replica-0-rank-0.sock"
    assert private_ipc(handle) == f"ipc://{private_tmp}/rl-colocate-zmq-01000000-replica-0-rank-0.sock"
    assert private_ipc("tcp://127.0.0.1:5555") == "tcp://127.0.0.1:5555"
    # a temporary folder too deep for a socket path (107 bytes): VeRL's own path stays
    too_long = handle.replace("01000000", "0" * 100)
    assert private_ipc(too_long) == too_long


# Hooks the CPU plugin overrides that the TPU platform leaves to PlatformBase, each with why.
TPU_INHERITS = {
    "rollout_env_vars": "PlatformBase's {}: vLLM's TPU backend selects itself (not verified on TPU hardware)",
    # the CPU platform overrides it for a CPU cluster's slots (Ray takes CPUs as num_cpus only)
    "ray_resource_options": "PlatformBase's {'resources': {'TPU': n}}: TPU is a Ray resource by that name",
}


def test_tpu_platform_implements_the_hooks_the_cpu_run_needed(monkeypatch):
    """The CPU plugin is the one VeRL's trainer has run on here: every hook it had to
    provide, the TPU platform provides too (or inherits, for a reason listed above)."""
    import sys

    from verl.plugin.platform import PlatformRegistry

    from tpu_pipeline.rl.tpu_platform import _platform_class

    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    sys.modules.pop("tpu_pipeline.rl.verl_cpu_platform", None)
    try:
        from tpu_pipeline.rl.verl_cpu_platform import register

        cpu = {n for n in vars(register()) if not n.startswith("_")}
    finally:
        PlatformRegistry._platforms.pop("cpu", None)
        sys.modules.pop("tpu_pipeline.rl.verl_cpu_platform", None)
    tpu = {n for n in vars(_platform_class()) if not n.startswith("_")}
    assert len(cpu) >= 20
    assert cpu - tpu == set(TPU_INHERITS), f"TPU platform lacks {sorted(cpu - tpu - set(TPU_INHERITS))}"
