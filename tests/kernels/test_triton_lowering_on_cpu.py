"""Every kernel lowers to Triton IR for CUDA, on a machine without a GPU.

jax.export lowers for a platform it does not have: each kernel at issue 13's
benchmark shapes, with the H200's block configuration (whose target, "gpu", gives
Triton launch parameters and power-of-two feature padding), goes through Pallas's
Triton lowering. What that catches here:
an operation the Triton lowering does not support, and any tensor in the Triton
module above Triton's 1,048,576-element limit or with a side that is not a power
of two (the H200 refused a 1024x2048 tile at compile time). Shared memory is
only known once Triton compiles for the chip: that stays a GPU check.
Uses JAX internals (the Triton lowering function) to read the modules.
"""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import pytest
from jax import export
from jax._src.lib import triton as triton_lib
from jax._src.lib import version as jaxlib_version
from jax._src.pallas.triton import pallas_call_registration as triton_registration

from tpu_pipeline.kernels import _attention as A
from tpu_pipeline.kernels import _blocks as C
from tpu_pipeline.kernels import _logprobs as L
from tpu_pipeline.kernels import _rmsnorm as R

# jaxlib > 0.10.2 compiles each Triton module while lowering, which needs the CUDA
# plugin's compiler: without it (a CPU machine with a newer JAX) there is nothing to test.
pytestmark = pytest.mark.skipif(jaxlib_version > (0, 10, 2) and not triton_lib.has_compilation_handler("cuda"),
                                reason="this jaxlib compiles Triton while lowering and has no CUDA compiler here")

S = jax.ShapeDtypeStruct
BF16, F32, I32 = jnp.bfloat16, jnp.float32, jnp.int32
TRITON_CALL = "__gpu$xla.gpu.triton"


@pytest.fixture
def triton_modules(monkeypatch):
    """Records the text of every Triton module made."""
    modules = []
    real = triton_registration.lowering.lower_jaxpr_to_triton_module

    def record(*args, **kwargs):
        result = real(*args, **kwargs)
        modules.append(result.module.operation.get_asm())
        return result

    monkeypatch.setattr(triton_registration.lowering, "lower_jaxpr_to_triton_module", record)
    jax.clear_caches()  # a cached trace would not lower again, and make no module to record
    yield modules
    jax.clear_caches()


def lower_for_cuda(fn, *args) -> str:
    exp = export.export(jax.jit(fn), platforms=["cuda"],
                        disabled_checks=[export.DisabledSafetyCheck.custom_call(TRITON_CALL)])(*args)
    return exp.mlir_module()


def tensor_shapes(asm: str) -> list[tuple[int, ...]]:
    return [tuple(int(d) for d in m.split("x")) for m in re.findall(r"tensor<((?:\d+x)+)", asm)
            for m in [m.rstrip("x")]]


def check_triton_modules(modules: list[str]) -> None:
    assert modules
    for asm in modules:
        for shape in tensor_shapes(asm):
            assert math.prod(shape) <= C.TRITON_MAX_BLOCK_ELEMS, f"tensor {shape} exceeds Triton's limit"
            assert all(d & (d - 1) == 0 for d in shape), f"tensor {shape}: a side is not a power of two"


def _cases():
    h200 = C.H200

    def rms(direction, n, d, dt):
        cfg = C.rms_norm_blocks(n, d, h200, direction)
        if direction == "fwd":
            return (lambda x, w: R.rms_norm_fwd.native(x, w, eps=1e-6, cfg=cfg, interpret=False),
                    S((n, d), dt), S((d,), dt))
        return (lambda x, w, r, dy: R.rms_norm_bwd.native(x, w, r, dy, cfg=cfg, interpret=False),
                S((n, d), dt), S((d,), dt), S((n, 1), F32), S((n, d), dt))

    def attn(direction, b, h, hkv, s, d, dt):
        cfg = C.attention_blocks(s, s, d, jnp.dtype(dt).itemsize, h200, direction)
        q, kv, bounds = S((b, h, s, d), dt), S((b, hkv, s, d), dt), S((b, 2), I32)
        if direction == "fwd":
            return (lambda q, k, v, bd: A.attention_fwd.native(q, k, v, bd, causal=True, scale=0.1, cfg=cfg,
                                                               interpret=False), q, kv, kv, bounds)
        return (lambda q, k, v, bd, o, lse, do: A.attention_bwd.native(q, k, v, bd, o, lse, do, causal=True, scale=0.1,
                                                                       cfg=cfg, interpret=False),
                q, kv, kv, bounds, q, S((b, h, s), F32), q)

    def tl(direction, n, v, dt):
        cfg = C.token_logprobs_blocks(n, v, jnp.dtype(dt).itemsize, h200, direction)
        if direction == "fwd":
            return (lambda x, lab: L.token_logprobs_fwd.native(x, lab, cfg=cfg, interpret=False), S((n, v), dt),
                    S((n,), I32))
        return (lambda x, lab, lse, g: L.token_logprobs_bwd.native(x, lab, lse, g, cfg=cfg, interpret=False),
                S((n, v), dt), S((n,), I32), S((n,), F32), S((n,), F32))

    def ltl(direction, n, h, v, dt):
        cfg = C.linear_logprobs_blocks(n, h, v, jnp.dtype(dt).itemsize, h200, direction)
        if direction == "fwd":
            return (lambda x, w, lab: L.linear_token_logprobs_fwd.native(x, w, lab, cfg=cfg, interpret=False),
                    S((n, h), dt), S((v, h), dt), S((n,), I32))
        return (lambda x, w, lab, lse, g: L.linear_token_logprobs_bwd.native(x, w, lab, lse, g, cfg=cfg,
                                                                             interpret=False),
                S((n, h), dt), S((v, h), dt), S((n,), I32), S((n,), F32), S((n,), F32))

    cases = {}
    for direction in ("fwd", "bwd"):
        cases[f"rms_norm-{direction}-16384x4096-bf16"] = rms(direction, 16384, 4096, BF16)
        cases[f"rms_norm-{direction}-333x1000-f32"] = rms(direction, 333, 1000, F32)
        cases[f"attention-{direction}-4x16/4x2048x128-bf16"] = attn(direction, 4, 16, 4, 2048, 128, BF16)
        cases[f"attention-{direction}-2x8/2x77x64-f32"] = attn(direction, 2, 8, 2, 77, 64, F32)
        cases[f"attention-{direction}-1x12/4x100x128-bf16"] = attn(direction, 1, 12, 4, 100, 128, BF16)  # group of 3
        cases[f"token_logprobs-{direction}-4096x32768-bf16"] = tl(direction, 4096, 32768, BF16)
        cases[f"linear-{direction}-4096x2048x32768-bf16"] = ltl(direction, 4096, 2048, 32768, BF16)
        cases[f"linear-{direction}-100x256x5000-f32"] = ltl(direction, 100, 256, 5000, F32)
        cases[f"linear-{direction}-4096x8192x256000-bf16"] = ltl(direction, 4096, 8192, 256000, BF16)
    return cases


CASES = _cases()


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_lowers_to_triton_within_its_limits(name, triton_modules):
    fn, *args = CASES[name]
    hlo = lower_for_cuda(fn, *args)
    assert TRITON_CALL in hlo  # Pallas's Triton backend, not Mosaic GPU (JAX's default without our params)
    assert re.search(r"num_warps = [1-8] : i32", hlo)
    check_triton_modules(triton_modules)


def test_the_check_sees_the_tile_that_failed_on_the_h200(triton_modules):
    """Control: a [1024, 2048] weight tile (the old kernel's at H=2048) is flagged."""
    old = C.LinearLogprobsBlocks(rows=16, vocab=1024, hidden=2048, num_warps=4, num_stages=2, atomics=True)
    lower_for_cuda(lambda x, w, lab: L.linear_token_logprobs_fwd.native(x, w, lab, cfg=old, interpret=False),
                   S((64, 2048), BF16), S((4096, 2048), BF16), S((64,), I32))
    with pytest.raises(AssertionError, match=r"\(1024, 2048\) exceeds Triton's limit"):
        check_triton_modules(triton_modules)
