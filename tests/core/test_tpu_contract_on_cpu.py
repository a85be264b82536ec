"""The TPU path against the real torch-tpu 0.2.0 (from PyPI), on a machine without a TPU.

Runs in .venv-tpu (built by `make install`: torch-tpu 0.2.0 + libtpu beside .venv's
torch 2.13.0 CPU and JAX), through child processes of its interpreter: torch-tpu hooks
every `import torch`, so it never loads into the test process. What is checked here,
on the package itself rather than a fake:
  - the device probe, with and without TPU signs in the environment: one "no TPU
    visible" line, exit 2, no traceback, no hang (a time limit);
  - torch-tpu's own names the code relies on: the legacy torch.tpu queries raise
    (so nothing may call them), eager modes switch on
    torch_tpu._internal.execution_mode, the "tpu" torch.compile backend registers;
  - every kernel, forward and backward, wrapped with the real torch.tpu.pallas.jax_op
    (_tpu.run): the op registers and infers its output shapes on meta tensors, which
    exports the kernel for the TPU, and the shapes are those JAX gives;
  - rl/tpu_platform against the names of VeRL's TPU plugin (device "tpu", backend
    "tpu_dist", which torch-tpu registers, Ray resource "TPU").
What stays with the fakes (tests/core/test_device.py, tests/kernels/test_bridge_on_cpu.py):
anything that runs on a TPU (a kernel's numbers, a TPU counted), which needs the chip.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TPU_PYTHON = ROOT / ".venv-tpu" / "bin" / "python"

pytestmark = pytest.mark.skipif(not TPU_PYTHON.exists(),
                                reason=".venv-tpu is absent (make install builds it): no real torch-tpu to check")


def run_tpu(args: list[str], timeout: int = 420, **env) -> subprocess.CompletedProcess:
    """Runs .venv-tpu's Python with a clean TPU environment plus `env`."""
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("TPU_", "TORCH_DEVICE_BACKEND", "JAX_PLATFORMS", "PYTHONPATH"))}
    # torch-tpu warns on every import that tcmalloc is not preloaded: true, and noise here.
    full.update(PYTHONWARNINGS="ignore:<TorchTpu/Performance/TcMalloc/", **env)
    return subprocess.run([str(TPU_PYTHON), *args], env=full, capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("signs", [{}, {"TPU_ACCELERATOR_TYPE": "v5litepod-4", "TPU_NAME": "my-tpu"}],
                         ids=["no-tpu-signs", "tpu-signs"])
def test_device_tpu_without_a_tpu_is_one_line_exit_2(signs):
    """With TPU signs the parent loads torch-tpu (auto-load on) and the probe starts it
    in a child; without them neither happens. Either way: one line, exit 2."""
    r = run_tpu(["-m", "tpu_pipeline", "doctor", "--device", "tpu"], **signs)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "Error: device 'tpu' asked for but no TPU is visible (torch-tpu 0.2.0 sees none); available: cpu")


CONTRACT = textwrap.dedent(
    r"""
    import dataclasses, functools, inspect, json, re
    import jax, jax.numpy as jnp, torch
    import torch_tpu
    import torch_tpu._internal.compile  # registers the "tpu" torch.compile backend
    from torch._dynamo.backends.registry import lookup_backend
    from torch_tpu._internal import execution_mode

    from tpu_pipeline import device as D
    from tpu_pipeline.kernels import _attention as A, _blocks as C, _bridge as B, _logprobs as L, _rmsnorm as R
    from tpu_pipeline.kernels import _tpu

    out = {"versions": {"torch": torch.__version__, "jax": jax.__version__}}

    # The legacy queries raise in 0.2.0 (the reason the probe uses torch.accelerator).
    legacy = {}
    for name in ("is_available", "device_count"):
        try:
            getattr(torch.tpu, name)()
            legacy[name] = "returned"
        except RuntimeError as e:
            legacy[name] = str(e)
    out["legacy"] = legacy
    out["accelerator"] = [torch.accelerator.is_available(), torch.accelerator.device_count()]

    # Eager modes through the library's eager_mode on the real module.
    tpu = dataclasses.replace(D.select_device("cpu"), kind="tpu")
    modes = {}
    for mode in ("fused", "debug", "strict"):
        with D.eager_mode(mode, tpu):
            modes[mode] = execution_mode.eager_mode.name
    out["eager"] = modes
    out["eager_after"] = execution_mode.eager_mode.name

    # The compile backend the TPU platform names.
    out["compile_backend"] = type(lookup_backend("tpu")).__name__

    # Every kernel through the real jax_op, on meta tensors, against JAX's own shapes.
    def meta(shape, dtype=torch.float32):
        return torch.empty(shape, dtype=dtype, device="meta")

    def jax_shapes(fn, tensors, static):
        specs = [jax.ShapeDtypeStruct(tuple(t.shape), jnp.dtype(str(t.dtype).split(".")[1])) for t in tensors]
        res = jax.eval_shape(functools.partial(fn.native, interpret=True, **static), *specs)  # the CPU path
        res = res if isinstance(res, (tuple, list)) else (res,)
        return [[list(r.shape), str(r.dtype)] for r in res]

    TPU = C.TPU
    bf, i32 = torch.bfloat16, torch.int32
    cases = {
        "rms_norm_fwd": (R.rms_norm_fwd, [meta((96, 1000), bf), meta((1000,), bf)],
                         dict(eps=1e-6, cfg=B.rms_norm_blocks(96, 1000, TPU, "fwd"))),
        "rms_norm_bwd": (R.rms_norm_bwd, [meta((96, 1000), bf), meta((1000,), bf), meta((96, 1)), meta((96, 1000), bf)],
                         dict(cfg=B.rms_norm_blocks(96, 1000, TPU, "bwd"))),
        "flash_attention_fwd": (A.attention_fwd, [meta((2, 8, 77, 80), bf), meta((2, 2, 128, 80), bf),
                                                  meta((2, 2, 128, 80), bf), meta((2, 2), i32)],
                                dict(causal=True, scale=0.1, cfg=B.attention_blocks(77, 128, 80, 2, TPU, "fwd"))),
        "flash_attention_bwd": (A.attention_bwd, [meta((2, 8, 77, 80), bf), meta((2, 2, 128, 80), bf),
                                                  meta((2, 2, 128, 80), bf), meta((2, 2), i32), meta((2, 8, 77, 80), bf),
                                                  meta((2, 8, 77)), meta((2, 8, 77, 80), bf)],
                                dict(causal=True, scale=0.1, cfg=B.attention_blocks(77, 128, 80, 2, TPU, "bwd"))),
        "token_logprobs_fwd": (L.token_logprobs_fwd, [meta((37, 5003), bf), meta((37,), i32)],
                               dict(cfg=B.token_logprobs_blocks(37, 5003, 2, TPU, "fwd"))),
        "token_logprobs_bwd": (L.token_logprobs_bwd, [meta((37, 5003), bf), meta((37,), i32), meta((37,)), meta((37,))],
                               dict(cfg=B.token_logprobs_blocks(37, 5003, 2, TPU, "bwd"))),
        "linear_token_logprobs_fwd": (L.linear_token_logprobs_fwd, [meta((37, 200), bf), meta((5003, 200), bf),
                                                                    meta((37,), i32)],
                                      dict(cfg=B.linear_logprobs_blocks(37, 200, 5003, 2, TPU, "fwd"))),
        "linear_token_logprobs_bwd": (L.linear_token_logprobs_bwd, [meta((37, 200), bf), meta((5003, 200), bf),
                                                                    meta((37,), i32), meta((37,)), meta((37,))],
                                      dict(cfg=B.linear_logprobs_blocks(37, 200, 5003, 2, TPU, "bwd"))),
    }
    kernels = {}
    for name, (fn, tensors, static) in cases.items():
        got = _tpu.run(fn, tensors, static)
        kernels[name] = {"jax_op": [[list(t.shape), str(t.dtype).split(".")[1]] for t in got],
                         "device": sorted({t.device.type for t in got}),
                         "jax": jax_shapes(fn, tensors, static)}
    out["kernels"] = kernels
    key = (R.rms_norm_fwd, tuple(sorted(cases["rms_norm_fwd"][2].items())), False)  # as _tpu.run asks
    out["op_type"] = type(_tpu.op_for(*key)).__name__

    # rl/tpu_platform against VeRL's TPU plugin names, and torch-tpu's process-group name.
    from verl.plugin.platform import PlatformRegistry
    from tpu_pipeline.rl import tpu_platform
    cls = PlatformRegistry.get("tpu")
    p = cls()
    import torch_tpu._loader
    loader = inspect.getsource(torch_tpu._loader)
    out["platform"] = {
        "registered_is_ours": cls is tpu_platform.register(),
        "device_name": p.device_name, "ray_resource": p.ray_resource_name(), "dist": tpu_platform.DIST_BACKEND,
        "backend_here": p.communication_backend_name(), "is_available": p.is_available(),
        "device_count": p.device_count(),
        "torch_tpu_registers_dist": bool(re.search(r'register_backend\(\s*"tpu_dist"', loader)),
    }
    print("CONTRACT " + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def contract() -> dict:
    r = run_tpu(["-c", CONTRACT], TPU_PIPELINE_IGNORE_TPU_HARDWARE="1", TORCH_DEVICE_BACKEND_AUTOLOAD="1",
                JAX_PLATFORMS="cpu")
    assert r.returncode == 0, r.stderr[-4000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("CONTRACT ")][-1]
    return json.loads(line[len("CONTRACT "):])


def test_legacy_torch_tpu_queries_raise_and_point_to_torch_accelerator(contract):
    for name, msg in contract["legacy"].items():
        assert "torch.accelerator" in msg, (name, msg)
    assert contract["accelerator"] == [False, 0]


def test_eager_modes_switch_on_the_real_module(contract):
    assert contract["eager"] == {"fused": "DEFER_AND_FUSE", "debug": "DEFER_NEVER_AND_LAUNCH_BLOCKING",
                                 "strict": "DEFER_NEVER"}
    assert contract["eager_after"] == "DEFER_NEVER"


def test_the_tpu_compile_backend_is_registered(contract):
    assert contract["compile_backend"] == "TpuBackend"


KERNEL_NAMES = ["rms_norm_fwd", "rms_norm_bwd", "flash_attention_fwd", "flash_attention_bwd", "token_logprobs_fwd",
                "token_logprobs_bwd", "linear_token_logprobs_fwd", "linear_token_logprobs_bwd"]


@pytest.mark.parametrize("name", KERNEL_NAMES)
def test_kernel_through_the_real_jax_op_infers_jax_shapes_on_meta(contract, name):
    k = contract["kernels"][name]
    assert k["device"] == ["meta"]
    assert k["jax_op"] == k["jax"], k


def test_kernel_shapes_by_hand(contract):
    """The shapes themselves, for two kernels (the comparison above could agree on wrong ones)."""
    k = contract["kernels"]
    assert k["flash_attention_fwd"]["jax_op"] == [[[2, 8, 77, 80], "bfloat16"], [[2, 8, 77], "float32"]]
    assert k["rms_norm_bwd"]["jax_op"] == [[[96, 1000], "bfloat16"], [[1000], "bfloat16"]]
    assert contract["op_type"] == "_JaxCustomOpDef"  # torch-tpu's own custom op class


def test_tpu_platform_matches_verls_tpu_plugin_names(contract):
    p = contract["platform"]
    assert p["registered_is_ours"]
    assert (p["device_name"], p["ray_resource"], p["dist"]) == ("tpu", "TPU", "tpu_dist")
    assert p["torch_tpu_registers_dist"]  # the name torch-tpu gives its process group
    assert p["backend_here"] == "gloo"  # no TPU started here, so "tpu_dist" is not registered
    assert (p["is_available"], p["device_count"]) == (False, 0)
