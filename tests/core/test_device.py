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

    def _internal(*a):  # as torch-tpu 0.2.0: the legacy device queries raise
        raise RuntimeError("is_available is internal to TorchTPU. Use torch.accelerator.is_available instead")

    torch.utils.rename_privateuse1_backend("tpu")
    torch.tpu = types.SimpleNamespace(is_available=_internal, device_count=_internal)
    torch.accelerator.is_available = lambda: True
    torch.accelerator.current_accelerator = lambda *a, **k: torch.device("tpu")
    torch.accelerator.device_count = lambda: 4
    """
)

# torch-tpu without a TPU where it expected one: the runtime aborts the process at its first use.
FAKE_ABORTS = FAKE_TORCH_TPU + "torch.accelerator.device_count = lambda: __import__('os').abort()\n"
FAKE_HANGS = FAKE_TORCH_TPU + "torch.accelerator.device_count = lambda: __import__('time').sleep(600)\n"
FAKE_NO_TPU = FAKE_TORCH_TPU + "torch.accelerator.is_available = lambda: False\n"


@pytest.fixture
def fake_torch_tpu(tmp_path):
    """A fake torch_tpu package on a path that only child processes see.

    It renames torch's privateuse1 backend to "tpu", which cannot be undone in
    a process, so every test that loads it runs its checks in a subprocess.
    run(code, fake=..., version=..., **env) -> the child's stdout (asserts exit 0).
    """

    def run(code: str, fake: str = FAKE_TORCH_TPU, version: str = "0.2.0", **env):
        pkg = tmp_path / "torch_tpu"
        (pkg / "_internal").mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text(fake)
        (pkg / "_internal" / "__init__.py").write_text("")
        (pkg / "_internal" / "execution_mode.py").write_text(
            "from torch_tpu import EagerMode\neager_mode = EagerMode.DEFER_NEVER\n"
        )
        dist = tmp_path / "torch_tpu-0.dist-info"
        dist.mkdir(exist_ok=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch-tpu\nVersion: {version}\n")
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


def test_probe_asks_torch_accelerator_in_a_child(fake_torch_tpu):
    """The count comes from torch.accelerator (the fake's torch.tpu queries raise, as
    torch-tpu 0.2.0's do) and from a child: this process has not loaded torch_tpu."""
    fake_torch_tpu(
        """
        import sys
        from tpu_pipeline._tpu_guard import probe_tpu
        p = probe_tpu()
        assert (p.count, p.version, p.error) == (4, "0.2.0", None), p
        assert "torch_tpu" not in sys.modules
        """
    )


@pytest.mark.parametrize("fake,version,timeout,error", [
    (FAKE_TORCH_TPU, "0.1.3", "120", "torch-tpu 0.1.3 predates the torch.accelerator device API; tpu-pipeline "
                                     "needs torch-tpu >= 0.2.0"),
    (FAKE_ABORTS, "0.2.0", "120", "the TPU runtime aborted starting (SIGABRT)"),
    (FAKE_HANGS, "0.2.0", "4", "torch-tpu did not answer within 4 s"),
    (FAKE_NO_TPU, "0.2.0", "120", "no TPU is visible (torch-tpu 0.2.0 sees none)"),
])
def test_tpu_asked_for_but_unusable_is_one_line_and_auto_falls_back(fake_torch_tpu, fake, version, timeout, error):
    out = fake_torch_tpu(
        """
        from tpu_pipeline import UserError, select_device
        try:
            select_device("tpu")
            raise SystemExit("select_device('tpu') did not refuse")
        except UserError as e:
            print(e)
        p = select_device("auto")
        assert p.kind == "cpu" and "sees no TPU" in p.reason, p
        """,
        fake=fake, version=version, TPU_ACCELERATOR_TYPE="v5litepod-4", TPU_PIPELINE_TPU_PROBE_TIMEOUT=timeout,
    )
    line = out.strip()
    assert "\n" not in line and line.startswith("device 'tpu' asked for but ") and line.endswith("available: cpu")
    assert error in line, line


def test_cli_refuses_tpu_in_one_line_with_exit_2(fake_torch_tpu):
    out = fake_torch_tpu(
        """
        import subprocess, sys
        r = subprocess.run([sys.executable, "-m", "tpu_pipeline", "doctor", "--device", "tpu"],
                           capture_output=True, text=True, timeout=240)
        print(r.returncode)
        print(r.stderr.strip().splitlines()[-1])
        assert "Traceback" not in r.stderr, r.stderr
        """,
        fake=FAKE_ABORTS, TPU_ACCELERATOR_TYPE="v5litepod-4",
    )
    code, line = out.strip().splitlines()
    assert code == "2"
    assert line.startswith("Error: device 'tpu' asked for but the TPU runtime aborted starting (SIGABRT)"), line


@pytest.mark.parametrize("preset,want", [(None, "1"), ("0", "0")])
def test_import_skips_libtpus_metadata_query_unless_the_user_chose(preset, want):
    env = {k: v for k, v in os.environ.items() if k != "TPU_SKIP_MDS_QUERY"}
    if preset is not None:
        env["TPU_SKIP_MDS_QUERY"] = preset
    out = subprocess.run([sys.executable, "-c", "import os, tpu_pipeline; print(os.environ['TPU_SKIP_MDS_QUERY'])"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == want, out.stderr[-2000:]


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


def test_no_code_calls_the_legacy_torch_tpu_device_queries():
    """torch-tpu 0.2.0 raises on torch.tpu's is_available/device_count: the probe asks
    torch.accelerator. Nothing in the library, its stages, tests or benchmarks calls them."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2]
    banned = re.compile(r"\btpu\.(is_available|device_count)\s*\(")
    hits = [f"{p.relative_to(root)}:{i}" for d in ("tpu_pipeline", "kernels", "rl", "train", "convert", "bench", "tests")
            for p in (root / d).rglob("*.py") for i, line in enumerate(p.read_text().splitlines(), 1)
            if banned.search(line)]
    assert hits == []
