"""Every kernel, forward and backward, lowers for a TPU and for CUDA GPUs on this CPU box.

`jax.export(jax.jit(fn), platforms=[...])` runs the compiler's lowering for a chip this
machine does not have: Mosaic's TPU lowering (the module then holds a tpu_custom_call)
and Pallas's Triton lowering for CUDA (a Triton custom call with the launch
parameters). The blocks and compiler parameters are the bridge's for that chip
(`_bridge.*_blocks` with a named device: the TPU, an H200 and an A100), so what lowers
here is what the bridge would run there. What this catches: a block shape that breaks
TPU's (8, 128) rule, an operation a lowering does not support, a kernel that falls to
Mosaic GPU for lack of Triton parameters. What it cannot: VMEM / shared memory
overflows and numerics, which need the chip (bench/gpu_check.sh on a GPU).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import export

from tpu_pipeline.kernels import _attention as A
from tpu_pipeline.kernels import _blocks as C
from tpu_pipeline.kernels import _bridge as B
from tpu_pipeline.kernels import _logprobs as L
from tpu_pipeline.kernels import _rmsnorm as R

S = jax.ShapeDtypeStruct
BF16, F32, I32 = jnp.bfloat16, jnp.float32, jnp.int32
TRITON_CALL = "__gpu$xla.gpu.triton"
PLATFORM = {"tpu": "tpu", "h200": "cuda", "a100": "cuda"}


def rms(chip, direction, n, d, dt=BF16):
    cfg = B.rms_norm_blocks(n, d, C.named_device(chip), direction)
    if direction == "fwd":
        return lambda x, w: R.rms_norm_fwd.native(x, w, eps=1e-6, cfg=cfg, interpret=False), S((n, d), dt), S((d,), dt)
    return (lambda x, w, r, dy: R.rms_norm_bwd.native(x, w, r, dy, cfg=cfg, interpret=False),
            S((n, d), dt), S((d,), dt), S((n, 1), F32), S((n, d), dt))


def attention(chip, direction, b, h, hkv, sq, sk, d, dt=BF16):
    cfg = B.attention_blocks(sq, sk, d, jnp.dtype(dt).itemsize, C.named_device(chip), direction)
    # The bridge pads k/v to the kernel's bucket of the key length (_bridge._kv_padded).
    skp = A.kv_bucket(sk, cfg.k)
    q, kv, bounds = S((b, h, sq, d), dt), S((b, hkv, skp, d), dt), S((b, 2), I32)
    if direction == "fwd":
        return (lambda q, k, v, bd: A.attention_fwd.native(q, k, v, bd, causal=True, scale=0.1, cfg=cfg,
                                                           interpret=False), q, kv, kv, bounds)
    return (lambda q, k, v, bd, o, lse, do: A.attention_bwd.native(q, k, v, bd, o, lse, do, causal=True, scale=0.1,
                                                                   cfg=cfg, interpret=False),
            q, kv, kv, bounds, q, S((b, h, sq), F32), q)


def token_logprobs(chip, direction, n, v, dt=BF16):
    cfg = B.token_logprobs_blocks(n, v, jnp.dtype(dt).itemsize, C.named_device(chip), direction)
    if direction == "fwd":
        return (lambda x, lab: L.token_logprobs_fwd.native(x, lab, cfg=cfg, interpret=False),
                S((n, v), dt), S((n,), I32))
    return (lambda x, lab, lse, g: L.token_logprobs_bwd.native(x, lab, lse, g, cfg=cfg, interpret=False),
            S((n, v), dt), S((n,), I32), S((n,), F32), S((n,), F32))


def linear_token_logprobs(chip, direction, n, h, v, dt=BF16):
    cfg = B.linear_logprobs_blocks(n, h, v, jnp.dtype(dt).itemsize, C.named_device(chip), direction)
    if direction == "fwd":
        return (lambda x, w, lab: L.linear_token_logprobs_fwd.native(x, w, lab, cfg=cfg, interpret=False),
                S((n, h), dt), S((v, h), dt), S((n,), I32))
    return (lambda x, w, lab, lse, g: L.linear_token_logprobs_bwd.native(x, w, lab, lse, g, cfg=cfg, interpret=False),
            S((n, h), dt), S((v, h), dt), S((n,), I32), S((n,), F32), S((n,), F32))


@pytest.fixture(autouse=True)
def no_x64():
    """As the bridge runs them: 32-bit JAX, whatever the process holds (litert-torch's JAX bridge
    turns jax_enable_x64 on for the whole process when any convert test imports it)."""
    with jax.enable_x64(False):
        yield


# A Llama-sized step of each kernel (bf16): rows x hidden 1024 x 4096, 8 query heads on
# 2 kv heads at 512 tokens and head dim 128, a 32000-token vocabulary.
KERNELS = {
    "rms_norm": lambda chip, dr: rms(chip, dr, 1024, 4096),
    "flash_attention": lambda chip, dr: attention(chip, dr, 2, 8, 2, 512, 512, 128),
    "token_logprobs": lambda chip, dr: token_logprobs(chip, dr, 512, 32000),
    "linear_token_logprobs": lambda chip, dr: linear_token_logprobs(chip, dr, 512, 1024, 32000),
}


def lower(chip: str, fn, *args) -> str:
    jax.clear_caches()  # a trace cached for another chip's blocks must not be reused
    exp = export.export(jax.jit(fn), platforms=[PLATFORM[chip]],
                        disabled_checks=[export.DisabledSafetyCheck.custom_call(TRITON_CALL)])(*args)
    return exp.mlir_module()


def assert_lowered_for(chip: str, hlo: str) -> None:
    if PLATFORM[chip] == "tpu":
        assert "tpu_custom_call" in hlo  # Mosaic's TPU kernel
    else:
        assert TRITON_CALL in hlo and "num_warps" in hlo  # Triton, not Mosaic GPU


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("chip", list(PLATFORM))
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_kernel_lowers_for_chip(kernel, chip, direction):
    fn, *args = KERNELS[kernel](chip, direction)
    assert_lowered_for(chip, lower(chip, fn, *args))


# Shapes that are not the kernels' favourites: odd and tiny sequence lengths, head dims
# 64/80/128 (80 is neither a power of two nor a multiple of 128), vocabularies and
# feature widths that are not multiples of 128, float32 as well as bf16.
SWEEP = {
    "rms_norm-333x1000-f32": lambda chip, dr: rms(chip, dr, 333, 1000, F32),
    "rms_norm-7x80": lambda chip, dr: rms(chip, dr, 7, 80),
    "attention-s77-d64-gqa4": lambda chip, dr: attention(chip, dr, 2, 8, 2, 77, 77, 64),
    "attention-s129-d80": lambda chip, dr: attention(chip, dr, 1, 4, 4, 129, 129, 80),
    "attention-s1-decode-d128": lambda chip, dr: attention(chip, dr, 2, 4, 1, 1, 300, 128),
    "attention-s100-d128-group3-f32": lambda chip, dr: attention(chip, dr, 1, 12, 4, 100, 100, 128, F32),
    "token_logprobs-v5003": lambda chip, dr: token_logprobs(chip, dr, 37, 5003),
    "token_logprobs-v32001-f32": lambda chip, dr: token_logprobs(chip, dr, 100, 32001, F32),
    "linear-h200-v5003": lambda chip, dr: linear_token_logprobs(chip, dr, 37, 200, 5003),
}


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("chip", ["tpu", "h200"])
@pytest.mark.parametrize("case", list(SWEEP))
def test_shape_sweep_lowers(case, chip, direction):
    fn, *args = SWEEP[case](chip, direction)
    assert_lowered_for(chip, lower(chip, fn, *args))


def test_the_tpu_check_sees_a_block_that_breaks_the_8x128_rule():
    """Control: the attention forward as it was before issue 29 (log-sum-exp written as
    [bq] blocks of [B, H, S]) is refused by Mosaic's TPU lowering, operand named."""
    from jax.experimental import pallas as pl

    def old_lse_layout(x):
        return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]), grid=(1, 4, 2),
                              in_specs=[pl.BlockSpec((None, None, 128), lambda b, h, i: (b, h, i))],
                              out_specs=pl.BlockSpec((None, None, 128), lambda b, h, i: (b, h, i)),
                              out_shape=S((1, 4, 256), F32))(x)

    with pytest.raises(Exception, match="divisible by 8 and 128"):
        lower("tpu", old_lse_layout, S((1, 4, 256), F32))


def test_without_triton_parameters_cuda_lowering_falls_to_mosaic_gpu(monkeypatch):
    """Control (the state before issue 29): with no Triton parameters passed, Pallas
    lowers for CUDA through Mosaic GPU, which refuses these kernels (JAX 0.10.2: "Async
    copies only support copying <=256 elements along each dimension")."""
    from tpu_pipeline.kernels import _common

    monkeypatch.setattr(_common, "plgpu", None)
    fn, *args = token_logprobs("h200", "fwd", 64, 4096)
    with pytest.raises(Exception, match="(?i)copies|mosaic|shared memory"):
        lower("h200", fn, *args)


def test_named_devices_and_unknown_name():
    assert C.named_device("tpu").kind == "tpu" and C.named_device("h200").kind == "gpu"
    assert C.named_device("a100").onchip_bytes == 163 * 1024
    with pytest.raises(ValueError, match="unknown device 'v100'; valid: tpu, h200, a100"):
        C.named_device("v100")
