"""Device selection with and without a (fake) TorchTPU, eager modes, and the
Pallas-backed compile path on CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tpu_pipeline import UserError, compile, eager_mode, select_device
from tpu_pipeline import device as device_mod

FAKE_TORCH_TPU = textwrap.dedent(
    """
    import enum, types, torch

    class EagerMode(enum.Enum):
        DEFER_NEVER = 0
        DEFER_AND_FUSE = 1
        DEFER_NEVER_AND_LAUNCH_BLOCKING = 2

    torch.utils.rename_privateuse1_backend("tpu")
    torch.tpu = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 4)
    """
)


@pytest.fixture
def fake_torch_tpu(tmp_path):
    """A fake torch_tpu package on a path that only child processes see.

    It renames torch's privateuse1 backend to "tpu", which cannot be undone in
    a process, so every test that loads it runs its checks in a subprocess.
    """
    pkg = tmp_path / "torch_tpu"
    (pkg / "_internal").mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_TORCH_TPU)
    (pkg / "_internal" / "__init__.py").write_text("")
    (pkg / "_internal" / "execution_mode.py").write_text(
        "from torch_tpu import EagerMode\neager_mode = EagerMode.DEFER_NEVER\n"
    )

    def run(code: str, **env):
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_")}
        full_env.update(PYTHONPATH=str(tmp_path), **env)
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout

    return run


@pytest.fixture
def no_tpu_hardware(monkeypatch):
    monkeypatch.setenv("TPU_PIPELINE_IGNORE_TPU_HARDWARE", "1")


def test_cpu_platform():
    p = select_device("cpu")
    assert p.kind == "cpu" and p.device == torch.device("cpu")
    assert p.compile_backend == "inductor"
    assert p.kernel_lowering == "interpret" and p.kernels_interpreted
    assert p.count == 1


def test_auto_without_torch_tpu_picks_cpu(no_tpu_hardware):
    p = select_device("auto")
    assert p.kind == "cpu"
    assert "no torch-tpu" in p.reason


def test_unknown_device_lists_valid():
    with pytest.raises(UserError, match="unknown device 'gpu'; valid: auto, tpu, cuda, cpu"):
        select_device("gpu")


def test_missing_cuda_names_available_devices(no_tpu_hardware):
    with pytest.raises(UserError, match="no CUDA GPU is visible; available: cpu"):
        select_device("cuda")


def test_tpu_without_torch_tpu_says_how_to_install():
    with pytest.raises(UserError, match=r"tpu-pipeline\[tpu\]"):
        select_device("tpu")


def test_fake_tpu_selected_on_tpu_hardware(fake_torch_tpu):
    fake_torch_tpu(
        """
        import sys
        from tpu_pipeline import select_device
        p = select_device("auto")
        assert (p.kind, p.count, p.compile_backend, p.kernel_lowering, p.bf16) == ("tpu", 4, "tpu", "mosaic-tpu", True), p
        assert p.device.type == "tpu"
        assert "torch_tpu" in sys.modules
        assert select_device("tpu").kind == "tpu"
        """,
        TPU_ACCELERATOR_TYPE="v5litepod-4",
    )


def test_installed_torch_tpu_is_not_loaded_without_tpu_hardware(fake_torch_tpu):
    fake_torch_tpu(
        """
        import os, sys
        from tpu_pipeline import select_device
        assert os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"
        p = select_device("auto")
        assert p.kind == "cpu" and "not loaded" in p.reason, p
        assert "torch_tpu" not in sys.modules
        """,
        TPU_PIPELINE_IGNORE_TPU_HARDWARE="1",
    )


def test_eager_modes_off_tpu():
    cpu = select_device("cpu")
    with eager_mode("strict", cpu):
        pass
    with pytest.raises(UserError, match="only on TPU"):
        with eager_mode("fused", cpu):
            pass
    with pytest.raises(UserError, match="unknown eager mode 'lazy'"):
        with eager_mode("lazy", cpu):
            pass


def test_eager_modes_on_fake_tpu(fake_torch_tpu):
    fake_torch_tpu(
        """
        from tpu_pipeline import eager_mode, select_device
        from torch_tpu._internal import execution_mode
        tpu = select_device("tpu")
        for mode, member in [("fused", "DEFER_AND_FUSE"), ("debug", "DEFER_NEVER_AND_LAUNCH_BLOCKING"),
                             ("strict", "DEFER_NEVER")]:
            with eager_mode(mode, tpu):
                assert execution_mode.eager_mode.name == member
            assert execution_mode.eager_mode.name == "DEFER_NEVER"
        """
    )


def _f(x, y):
    return torch.sin(x) * y + torch.relu(y - x).sum(dim=-1, keepdim=True)


def test_compile_matches_eager():
    x, y = torch.randn(8, 33), torch.randn(8, 33)
    out = compile(_f, platform=select_device("cpu"))(x, y)
    torch.testing.assert_close(out, _f(x, y))


def test_compile_with_pallas_emits_pallas_kernels_and_matches_eager():
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    x, y = torch.randn(8, 33), torch.randn(8, 33)
    compiled = compile(_f, platform=select_device("cpu"), inductor_pallas=True)
    out, codes = run_and_get_code(compiled, x, y)
    torch.testing.assert_close(out, _f(x, y), rtol=1e-5, atol=1e-5)
    code = "\n".join(codes)
    assert "pallas_call" in code and "interpret" in code


def test_pallas_option_key_per_platform():
    assert device_mod._PALLAS_CONFIG_KEY == {"cpu": "cpu_backend", "cuda": "cuda_backend", "tpu": "tpu_backend"}
