"""PyTorch bridge: one torch.library custom op per kernel direction.

Fake (meta) implementations return contiguous tensors, as the real ones do:
empty_like would copy a transposed input's strides and mislead the views that
torch.compile builds on the output.

Each forward op returns what its backward needs (rstd, log-sum-exp), and
`register_autograd` wires the Pallas backward op to it, so autograd and
torch.compile (through the fake implementations) see ordinary ops. Tensors
cross to JAX and back through DLPack without copies (contiguous inputs); on
CPU the kernels run in Pallas interpret mode; on a TPU they go through
torch.tpu.pallas.jax_op (see _tpu.py).

Block sizes: each op picks its configuration from _blocks for the tensors'
device (an H200's on CPU); explicit block_* arguments (0 = none) override it.
The `*_blocks` functions below take the device by name instead of from a tensor, so
a kernel can be lowered for a chip this machine does not have with exactly the
configuration the bridge would pick there (tests/kernels/test_lowering_on_cpu.py).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import torch
from torch import Tensor

from tpu_pipeline.kernels import _attention as A
from tpu_pipeline.kernels import _blocks as C
from tpu_pipeline.kernels import _logprobs as L
from tpu_pipeline.kernels import _rmsnorm as R
from tpu_pipeline.kernels import _tpu


@functools.lru_cache(maxsize=None)
def _cuda_device(index: int) -> C.Device:
    props = torch.cuda.get_device_properties(index)
    return C.cuda_device((props.major, props.minor), props.multi_processor_count, props.name)


def _device(t: Tensor) -> C.Device:
    """The budget the kernel's blocks are sized for. CPU (interpret mode) runs an
    H200's GPU configuration, so CPU tests exercise the blocks a GPU compiles."""
    kind = _device_type(t)
    if kind == "cuda":
        return _cuda_device(t.device.index if t.device.index is not None else torch.cuda.current_device())
    if kind == "tpu":
        return C.TPU
    return C.H200


def _interpreted(t: Tensor) -> bool:
    """Whether the kernels run in Pallas's interpreter for tensors like t (CPU tensors,
    and TPU tensors handed to a test's stand-in jax_op)."""
    kind = _device_type(t)
    return kind == "cpu" or (kind == "tpu" and _tpu.INTERPRET)


def _feature_dim(d: int, device: C.Device, interpret: bool) -> int:
    """The feature width the kernel pads to (see _common.feature_dim), for sizing blocks."""
    return max(16, C.next_pow2(d)) if device.kind == "gpu" and not interpret else d


def rms_norm_blocks(n: int, d: int, device: C.Device, direction: str, interpret: bool = False) -> C.RowBlocks:
    return C.rms_norm_blocks(n, _feature_dim(d, device, interpret), device, direction)


def attention_blocks(sq: int, sk: int, d: int, itemsize: int, device: C.Device, direction: str,
                     interpret: bool = False) -> C.AttentionBlocks:
    return C.attention_blocks(sq, sk, _feature_dim(d, device, interpret), itemsize, device, direction)


def token_logprobs_blocks(n: int, v: int, itemsize: int, device: C.Device, direction: str) -> C.VocabBlocks:
    return C.token_logprobs_blocks(n, v, itemsize, device, direction)


def linear_logprobs_blocks(n: int, h: int, v: int, itemsize: int, device: C.Device,
                           direction: str) -> C.LinearLogprobsBlocks:
    cfg = C.linear_logprobs_blocks(n, h, v, itemsize, device, direction)
    if L.plgpu is None:  # no Triton backend in this JAX: no atomics either
        cfg = dataclasses.replace(cfg, atomics=False)
    return cfg


def _override(cfg, **fields):
    """The picked configuration with the caller's explicit block sizes (0 = keep)."""
    return dataclasses.replace(cfg, **{k: v for k, v in fields.items() if v})


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _device_type(t: Tensor) -> str:
    return t.device.type


def _run(fn, tensors: Sequence[Tensor], **static) -> tuple[Tensor, ...]:
    tensors = [t.detach().contiguous() for t in tensors]
    # Set per call from the inputs: litert-torch's JAX bridge turns jax_enable_x64 on for the whole
    # process when it is imported, and Mosaic's TPU lowering refuses the kernels' index arithmetic
    # in 64 bits (tests/kernels/test_lowering_on_cpu.py).
    x64 = any(t.dtype == torch.float64 for t in tensors)
    with jax.enable_x64(x64):
        if _device_type(tensors[0]) == "tpu":
            return _tpu.run(fn, tensors, static)
        args = [jax.dlpack.from_dlpack(t) for t in tensors]
        out = fn(*args, interpret=_interpreted(tensors[0]), **static)
        out = out if isinstance(out, (tuple, list)) else (out,)
        return tuple(torch.from_dlpack(o) for o in out)


# ---------------------------------------------------------------- rms_norm

@torch.library.custom_op("tpu_pipeline::rms_norm_fwd", mutates_args=())
def _rms_fwd(x: Tensor, weight: Tensor, eps: float, block_rows: int) -> tuple[Tensor, Tensor]:
    d = x.shape[-1]
    cfg = _override(rms_norm_blocks(x.numel() // d, d, _device(x), "fwd", _interpreted(x)), rows=block_rows)
    y, rstd = _run(R.rms_norm_fwd, [x.reshape(-1, d), weight], eps=eps, cfg=cfg)
    return y.reshape(x.shape), rstd


@_rms_fwd.register_fake
def _(x, weight, eps, block_rows):
    return x.new_empty(x.shape), x.new_empty((x.numel() // x.shape[-1], 1), dtype=_acc(x.dtype))


@torch.library.custom_op("tpu_pipeline::rms_norm_bwd", mutates_args=())
def _rms_bwd(x: Tensor, weight: Tensor, rstd: Tensor, dy: Tensor, block_rows: int) -> tuple[Tensor, Tensor]:
    d = x.shape[-1]
    cfg = _override(rms_norm_blocks(x.numel() // d, d, _device(x), "bwd", _interpreted(x)), rows=block_rows)
    dx, dw = _run(R.rms_norm_bwd, [x.reshape(-1, d), weight, rstd, dy.reshape(-1, d)], cfg=cfg)
    return dx.reshape(x.shape), dw


@_rms_bwd.register_fake
def _(x, weight, rstd, dy, block_rows):
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


def _rms_setup(ctx, inputs, output):
    x, weight, _eps, block_rows = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.block_rows = block_rows
    ctx.mark_non_differentiable(output[1])


def _rms_backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = _rms_bwd(x, weight, rstd, dy, ctx.block_rows)
    return dx, dw, None, None


torch.library.register_autograd("tpu_pipeline::rms_norm_fwd", _rms_backward, setup_context=_rms_setup)


def rms_norm(x: Tensor, weight: Tensor, eps: float, block_rows: int | None) -> Tensor:
    if weight.dtype != x.dtype:
        weight = weight.to(x.dtype)
    return _rms_fwd(x, weight, eps, block_rows or 0)[0]


# ---------------------------------------------------------------- flash attention

def _kv_padded(k: Tensor, v: Tensor, kv_start: Tensor, block_k: int) -> tuple[Tensor, Tensor, Tensor]:
    """k, v padded along the sequence to the kernel's bucket, and per batch row the
    first and one-past-last key in use (int32 [B, 2]) as data."""
    sk = k.shape[2]
    pad = A.kv_bucket(sk, block_k) - sk
    if pad:
        k = torch.nn.functional.pad(k, (0, 0, 0, pad))
        v = torch.nn.functional.pad(v, (0, 0, 0, pad))
    start = kv_start.to(device=k.device, dtype=torch.int32)
    return k, v, torch.stack([start, torch.full_like(start, sk)], dim=1)


def _attn_cfg(q: Tensor, sk: int, direction: str, block_q: int, block_k: int) -> C.AttentionBlocks:
    cfg = attention_blocks(q.shape[2], sk, q.shape[3], q.element_size(), _device(q), direction, _interpreted(q))
    return _override(cfg, q=block_q, k=block_k)


@torch.library.custom_op("tpu_pipeline::flash_attention_fwd", mutates_args=())
def _attn_fwd(q: Tensor, k: Tensor, v: Tensor, kv_start: Tensor, causal: bool, scale: float, block_q: int,
              block_k: int) -> tuple[Tensor, Tensor]:
    cfg = _attn_cfg(q, k.shape[2], "fwd", block_q, block_k)
    k, v, bounds = _kv_padded(k, v, kv_start, cfg.k)
    return _run(A.attention_fwd, [q, k, v, bounds], causal=causal, scale=scale, cfg=cfg)


@_attn_fwd.register_fake
def _(q, k, v, kv_start, causal, scale, block_q, block_k):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=_acc(q.dtype))


@torch.library.custom_op("tpu_pipeline::flash_attention_bwd", mutates_args=())
def _attn_bwd(q: Tensor, k: Tensor, v: Tensor, kv_start: Tensor, o: Tensor, lse: Tensor, do: Tensor, causal: bool,
              scale: float, block_q: int, block_k: int) -> tuple[Tensor, Tensor, Tensor]:
    sk = k.shape[2]
    cfg = _attn_cfg(q, sk, "bwd", block_q, block_k)
    kp, vp, bounds = _kv_padded(k, v, kv_start, cfg.k)
    dq, dk, dv = _run(A.attention_bwd, [q, kp, vp, bounds, o, lse, do], causal=causal, scale=scale, cfg=cfg)
    return dq, dk[:, :, :sk].contiguous(), dv[:, :, :sk].contiguous()


@_attn_bwd.register_fake
def _(q, k, v, kv_start, o, lse, do, causal, scale, block_q, block_k):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _attn_setup(ctx, inputs, output):
    q, k, v, kv_start, causal, scale, block_q, block_k = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, kv_start, o, lse)
    ctx.args = (causal, scale, block_q, block_k)
    ctx.mark_non_differentiable(lse)


def _attn_backward(ctx, do, _dlse):
    q, k, v, kv_start, o, lse = ctx.saved_tensors
    dq, dk, dv = _attn_bwd(q, k, v, kv_start, o, lse, do, *ctx.args)
    return dq, dk, dv, None, None, None, None, None


torch.library.register_autograd("tpu_pipeline::flash_attention_fwd", _attn_backward, setup_context=_attn_setup)


def flash_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, kv_start: Tensor | None,
                    block_q: int | None, block_k: int | None) -> Tensor:
    k, v = k.to(q.dtype), v.to(q.dtype)
    if kv_start is None:
        kv_start = torch.zeros(q.shape[0], dtype=torch.int32, device=q.device)
    return _attn_fwd(q, k, v, kv_start, causal, scale, block_q or 0, block_k or 0)[0]


# ---------------------------------------------------------------- token log-probs

def _tl_cfg(logits: Tensor, direction: str, block_rows: int, block_vocab: int) -> C.VocabBlocks:
    v = logits.shape[-1]
    cfg = token_logprobs_blocks(logits.numel() // v, v, logits.element_size(), _device(logits), direction)
    return _override(cfg, rows=block_rows, vocab=block_vocab)


@torch.library.custom_op("tpu_pipeline::token_logprobs_fwd", mutates_args=())
def _tl_fwd(logits: Tensor, labels: Tensor, block_rows: int, block_vocab: int) -> tuple[Tensor, Tensor]:
    v = logits.shape[-1]
    lp, lse = _run(L.token_logprobs_fwd, [logits.reshape(-1, v), labels.reshape(-1).to(torch.int32)],
                   cfg=_tl_cfg(logits, "fwd", block_rows, block_vocab))
    return lp.reshape(labels.shape), lse.reshape(labels.shape)


@_tl_fwd.register_fake
def _(logits, labels, block_rows, block_vocab):
    acc = _acc(logits.dtype)
    return logits.new_empty(labels.shape, dtype=acc), logits.new_empty(labels.shape, dtype=acc)


@torch.library.custom_op("tpu_pipeline::token_logprobs_bwd", mutates_args=())
def _tl_bwd(logits: Tensor, labels: Tensor, lse: Tensor, g: Tensor, block_rows: int, block_vocab: int) -> Tensor:
    v = logits.shape[-1]
    (dx,) = _run(L.token_logprobs_bwd, [logits.reshape(-1, v), labels.reshape(-1).to(torch.int32),
                                        lse.reshape(-1), g.reshape(-1).to(lse.dtype)],
                 cfg=_tl_cfg(logits, "bwd", block_rows, block_vocab))
    return dx.reshape(logits.shape)


@_tl_bwd.register_fake
def _(logits, labels, lse, g, block_rows, block_vocab):
    return logits.new_empty(logits.shape)


def _tl_setup(ctx, inputs, output):
    logits, labels, block_rows, block_vocab = inputs
    ctx.save_for_backward(logits, labels, output[1])
    ctx.blocks = (block_rows, block_vocab)
    ctx.mark_non_differentiable(output[1])


def _tl_backward(ctx, g, _dlse):
    logits, labels, lse = ctx.saved_tensors
    return _tl_bwd(logits, labels, lse, g, *ctx.blocks), None, None, None


torch.library.register_autograd("tpu_pipeline::token_logprobs_fwd", _tl_backward, setup_context=_tl_setup)


def token_logprobs(logits: Tensor, labels: Tensor, block_rows: int | None, block_vocab: int | None) -> Tensor:
    return _tl_fwd(logits, labels, block_rows or 0, block_vocab or 0)[0]


# ---------------------------------------------------------------- fused LM head + log-probs

def _ltl_cfg(hidden: Tensor, weight: Tensor, direction: str, blocks: Sequence[int]) -> C.LinearLogprobsBlocks:
    h = hidden.shape[-1]
    cfg = linear_logprobs_blocks(hidden.numel() // h, h, weight.shape[0], hidden.element_size(), _device(hidden),
                                 direction)
    return _override(cfg, rows=blocks[0], vocab=blocks[1], hidden=blocks[2])


@torch.library.custom_op("tpu_pipeline::linear_token_logprobs_fwd", mutates_args=())
def _ltl_fwd(hidden: Tensor, weight: Tensor, labels: Tensor, blocks: list[int]) -> tuple[Tensor, Tensor]:
    h = hidden.shape[-1]
    lp, lse = _run(L.linear_token_logprobs_fwd, [hidden.reshape(-1, h), weight, labels.reshape(-1).to(torch.int32)],
                   cfg=_ltl_cfg(hidden, weight, "fwd", blocks))
    return lp.reshape(labels.shape), lse.reshape(labels.shape)


@_ltl_fwd.register_fake
def _(hidden, weight, labels, blocks):
    acc = _acc(hidden.dtype)
    return hidden.new_empty(labels.shape, dtype=acc), hidden.new_empty(labels.shape, dtype=acc)


@torch.library.custom_op("tpu_pipeline::linear_token_logprobs_bwd", mutates_args=())
def _ltl_bwd(hidden: Tensor, weight: Tensor, labels: Tensor, lse: Tensor, g: Tensor,
             blocks: list[int]) -> tuple[Tensor, Tensor]:
    h = hidden.shape[-1]
    dh, dw = _run(L.linear_token_logprobs_bwd,
                  [hidden.reshape(-1, h), weight, labels.reshape(-1).to(torch.int32), lse.reshape(-1),
                   g.reshape(-1).to(lse.dtype)], cfg=_ltl_cfg(hidden, weight, "bwd", blocks))
    return dh.reshape(hidden.shape), dw


@_ltl_bwd.register_fake
def _(hidden, weight, labels, lse, g, blocks):
    return hidden.new_empty(hidden.shape), weight.new_empty(weight.shape)


def _ltl_setup(ctx, inputs, output):
    hidden, weight, labels, blocks = inputs
    ctx.save_for_backward(hidden, weight, labels, output[1])
    ctx.blocks = blocks
    ctx.mark_non_differentiable(output[1])


def _ltl_backward(ctx, g, _dlse):
    hidden, weight, labels, lse = ctx.saved_tensors
    dh, dw = _ltl_bwd(hidden, weight, labels, lse, g, ctx.blocks)
    return dh, dw, None, None


torch.library.register_autograd("tpu_pipeline::linear_token_logprobs_fwd", _ltl_backward, setup_context=_ltl_setup)


def linear_token_logprobs(hidden: Tensor, weight: Tensor, labels: Tensor, block_rows: int | None,
                          block_vocab: int | None, block_hidden: int | None = None) -> Tensor:
    blocks = [block_rows or 0, block_vocab or 0, block_hidden or 0]
    return _ltl_fwd(hidden, weight.to(hidden.dtype), labels, blocks)[0]
