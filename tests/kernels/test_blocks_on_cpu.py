"""Block configurations per device (pure Python): every block the GPU will compile fits
its shared memory, Triton's tile limit, its power-of-two rule and the register budget."""

from __future__ import annotations

import itertools

import pytest

from tpu_pipeline.kernels import _blocks as C

H200_SMEM = 227 * 1024  # 232448 bytes: what Triton reported as available on an H200


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@pytest.mark.parametrize("h,v,itemsize",
                         list(itertools.product((256, 2048, 4096, 8192), (5000, 32768, 256000), (2, 4))))
def test_linear_logprobs_blocks_fit_the_h200(h, v, itemsize):
    for n, direction in itertools.product((100, 4096), ("fwd", "bwd")):
        cfg = C.linear_logprobs_blocks(n, h, v, itemsize, C.H200, direction)
        smem = cfg.onchip_bytes(itemsize, direction)
        assert smem <= H200_SMEM, (cfg, smem)
        assert max(cfg.tiles(direction).values()) <= 1_048_576
        # Every loaded tile has power-of-two sides >= 16 (tl.dot), and no tile grows with H or V.
        assert all(_pow2(b) and b >= 16 for b in (cfg.rows, cfg.vocab, cfg.hidden)), cfg
        assert cfg.vocab <= 128 and cfg.hidden <= 64 and cfg.rows <= 128
        assert cfg.atomics  # GPU: the single-kernel backward
        assert cfg.rows * cfg.vocab * (2 if direction == "bwd" else 1) / (32 * cfg.num_warps) <= C.MAX_REGS


def test_linear_forward_fills_the_h200():
    """Rows alone give N=4096 / 128 = 32 programs for 132 SMs: the vocabulary is split too."""
    cfg = C.linear_logprobs_blocks(4096, 2048, 32768, 2, C.H200, "fwd")
    programs = -(-4096 // cfg.rows) * cfg.vocab_splits
    assert programs >= 2 * C.H200.cores and cfg.vocab_splits <= -(-32768 // cfg.vocab)


def test_the_configurations_that_failed_on_the_h200_are_gone():
    """Issue 13's failures: a 1024x2048 weight tile (2M elements) at H=2048, and 2,130,048
    bytes of shared memory at N=100 H=256 V=5000. The old kernel loaded a whole
    [vocab block, H] weight tile; the new one never holds more than [vocab, hidden slice]."""
    for n, h, v in ((4096, 2048, 32768), (100, 256, 5000)):
        for d in ("fwd", "bwd"):
            cfg = C.linear_logprobs_blocks(n, h, v, 4, C.H200, d)
            assert cfg.vocab * cfg.hidden <= 128 * 64
            assert cfg.onchip_bytes(4, d) <= H200_SMEM


def test_the_smem_model_counts_what_the_old_kernel_asked_for():
    """The model must not under-count: the old forward at N=100 H=256 V=5000 float32 (rows
    32, one 1024-row weight tile of the full H=256, 2 stages) is what Triton refused with
    2,130,048 bytes requested; the model asks at least as much."""
    old = C.LinearLogprobsBlocks(rows=32, vocab=1024, hidden=256, num_warps=4, num_stages=2)
    assert old.onchip_bytes(4, "fwd") >= 2_130_048
    assert not old.fits(C.H200, 4, "fwd")


@pytest.mark.parametrize("device", [C.H200, C.CUDA_GENERIC])
def test_every_kernel_fits_each_gpu_budget(device):
    for d, itemsize, direction in itertools.product((32, 64, 128, 256), (2, 4), ("fwd", "bwd")):
        cfg = C.attention_blocks(2048, 2048, d, itemsize, device, direction)
        assert cfg.fits(device, itemsize, direction), cfg
        assert _pow2(cfg.q) and _pow2(cfg.k) and cfg.q >= 16 and cfg.k >= 16
    for n, v, itemsize, direction in itertools.product((7, 4096), (5000, 32768, 256000), (2, 4), ("fwd", "bwd")):
        cfg = C.token_logprobs_blocks(n, v, itemsize, device, direction)
        assert cfg.fits(device, itemsize, direction) and _pow2(cfg.rows) and _pow2(cfg.vocab), cfg
    for h, v, itemsize, direction in itertools.product((256, 8192), (5000, 256000), (2, 4), ("fwd", "bwd")):
        assert C.linear_logprobs_blocks(4096, h, v, itemsize, device, direction).fits(device, itemsize, direction)
    for d in (64, 256, 4096, 8192):
        cfg = C.rms_norm_blocks(16384, d, device, "bwd")
        assert cfg.fits(device, 4, "bwd") and _pow2(cfg.rows)


def test_attention_choices_per_head_dim_on_the_h200():
    """Forward 128x64 blocks, 4 warps at d=64 and 8 at d=128, 3 stages in bf16; float32
    and d=256 shrink to fit 227 KiB."""
    fwd64 = C.attention_blocks(2048, 2048, 64, 2, C.H200, "fwd")
    fwd128 = C.attention_blocks(2048, 2048, 128, 2, C.H200, "fwd")
    assert (fwd64.q, fwd64.k, fwd64.num_warps, fwd64.num_stages) == (128, 64, 4, 3)
    assert (fwd128.q, fwd128.k, fwd128.num_warps, fwd128.num_stages) == (128, 64, 8, 3)
    bwd128 = C.attention_blocks(2048, 2048, 128, 2, C.H200, "bwd")
    assert (bwd128.q, bwd128.k) == (64, 64)
    f32 = C.attention_blocks(2048, 2048, 128, 4, C.H200, "fwd")
    assert f32.onchip_bytes(4, "fwd") <= H200_SMEM and f32.num_stages >= 2
    # Short sequences get small blocks (a decode step: one query).
    assert C.attention_blocks(1, 9, 64, 2, C.H200, "fwd").q == 16


def test_rms_norm_takes_a_few_rows_at_large_d_and_many_at_small_d():
    """The old 64 x 4096 float32 tile spilled registers (4% of bandwidth on the H200)."""
    big = C.rms_norm_blocks(16384, 4096, C.H200, "fwd")
    small = C.rms_norm_blocks(16384, 256, C.H200, "fwd")
    assert big.rows * big.d <= C.RMS_TILE_ELEMS and big.num_warps == 8
    assert small.rows == 32 and small.rows * small.d <= C.RMS_TILE_ELEMS
    bwd = C.rms_norm_blocks(16384, 4096, C.H200, "bwd")
    assert bwd.programs == 4 * C.H200.cores


def test_blocks_prefer_dividing_the_vocabulary():
    """A block that divides V avoids padding (copying) the logits or the weight."""
    assert C.token_logprobs_blocks(4096, 32000, 2, C.H200, "fwd").vocab == 256
    assert C.linear_logprobs_blocks(4096, 2048, 151936, 2, C.H200, "fwd").vocab == 128
    assert C.token_logprobs_blocks(4096, 5000, 2, C.H200, "fwd").vocab == 2048  # nothing divides: pad


def test_cuda_device_by_compute_capability():
    assert C.cuda_device((9, 0), 132, "NVIDIA H200").onchip_bytes == H200_SMEM
    assert C.cuda_device((8, 0), 108, "NVIDIA A100").onchip_bytes == 163 * 1024
    assert C.cuda_device((8, 9), 128, "NVIDIA L40S").onchip_bytes == 99 * 1024
    unknown = C.cuda_device((13, 7), 10, "future GPU")
    assert unknown.onchip_bytes == C.CUDA_GENERIC.onchip_bytes and unknown.cores == 10


def test_tpu_blocks_are_lane_multiples_and_fit_vmem():
    cfg = C.attention_blocks(2048, 2048, 128, 2, C.TPU, "fwd")
    assert (cfg.q, cfg.k) == (128, 128) and cfg.onchip_bytes(2, "fwd") <= C.TPU.onchip_bytes
    lin = C.linear_logprobs_blocks(4096, 2048, 32768, 2, C.TPU, "fwd")
    assert not lin.atomics and lin.vocab % 128 == 0 and lin.hidden % 128 == 0
