"""Public kernel functions: validate, pick the implementation, call it."""

from __future__ import annotations

import functools
import warnings

import torch

from tpu_pipeline.errors import UserError
from tpu_pipeline.kernels import _reference as ref

IMPLS = ("auto", "pallas", "torch")


def _check_impl(impl: str) -> str:
    if impl not in IMPLS:
        raise UserError(f"unknown kernels impl {impl!r}; valid: {', '.join(IMPLS)}")
    return impl


@functools.lru_cache(maxsize=None)
def _jax_platforms() -> frozenset[str]:
    try:
        import jax  # heavy: JAX loads only when a kernel runs, not with `import tpu_pipeline.kernels`

        return frozenset(d.platform for d in jax.devices())
    except Exception:  # no usable JAX backend: auto falls back to torch
        return frozenset()


@torch.compiler.assume_constant_result
def _native_pallas(device_type: str) -> bool:
    """Whether Pallas can run compiled (not interpreted) on this device kind.

    A constant to torch.compile (it asks JAX about devices, which dynamo must not trace).
    """
    if device_type == "tpu":
        return True  # through torch.tpu.pallas.jax_op, no JAX device needed here
    if device_type == "cuda":
        if {"gpu", "cuda"} & _jax_platforms():
            return True
        warnings.warn("kernels impl 'auto': JAX sees no GPU (jax[cuda12] not installed?); using torch", stacklevel=2)
    return False


def use_pallas(impl: str, device: torch.device) -> bool:
    _check_impl(impl)
    if impl == "torch":
        return False
    if impl == "pallas":
        return True
    return _native_pallas(device.type)


def _bridge():
    # heavy: the bridge imports JAX and the Pallas kernels; the torch references need neither.
    from tpu_pipeline.kernels import _bridge as b

    return b


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, impl: str = "auto",
             block_rows: int | None = None) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight over the last dim; computes in float32, returns x.dtype."""
    if weight.shape != x.shape[-1:]:
        raise UserError(f"rms_norm: weight shape {tuple(weight.shape)} does not match x's last dim {x.shape[-1]}")
    if not use_pallas(impl, x.device):
        return ref.rms_norm(x, weight, eps)
    return _bridge().rms_norm(x, weight, float(eps), block_rows)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                    sm_scale: float | None = None, *, kv_start: torch.Tensor | None = None, impl: str = "auto",
                    block_q: int | None = None, block_k: int | None = None) -> torch.Tensor:
    """Attention over [B, H, S, D]; k/v may have fewer heads (grouped-query attention).

    Causal masking is aligned bottom-right (query i sees keys j <= i + Sk - Sq), so a
    decode step with a KV cache (Sq=1) sees every cached key. kv_start (int [B],
    optional) marks left padding: keys before kv_start[b] are masked for batch row b.
    Query rows that see no key return 0.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise UserError("flash_attention: q, k, v must be [batch, heads, seq, head_dim]")
    B, Hq, Sq, D = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise UserError(f"flash_attention: shapes do not fit: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if Hq % k.shape[1]:
        raise UserError(f"flash_attention: query heads ({Hq}) must be a multiple of key/value heads ({k.shape[1]})")
    if kv_start is not None and (kv_start.shape != (B,) or kv_start.is_floating_point()):
        raise UserError(f"flash_attention: kv_start must be integer [batch={B}], got {tuple(kv_start.shape)}")
    scale = D ** -0.5 if sm_scale is None else float(sm_scale)
    if not use_pallas(impl, q.device):
        return ref.flash_attention(q, k, v, causal, scale, kv_start)
    return _bridge().flash_attention(q, k, v, bool(causal), scale, kv_start, block_q, block_k)


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor, *, impl: str = "auto",
                   block_rows: int | None = None, block_vocab: int | None = None) -> torch.Tensor:
    """log_softmax(logits)[labels] without materializing the softmax: [..., V], [...] -> [...].

    Returns float32 (float64 for float64 logits). Labels < 0 (e.g. -100 padding) give 0
    and no gradient.
    """
    if logits.shape[:-1] != labels.shape:
        raise UserError(f"token_logprobs: labels {tuple(labels.shape)} must match logits {tuple(logits.shape)} minus the vocab dim")
    if labels.is_floating_point():
        raise UserError("token_logprobs: labels must be integer token ids")
    if not use_pallas(impl, logits.device):
        return ref.token_logprobs(logits, labels)
    return _bridge().token_logprobs(logits, labels, block_rows, block_vocab)


def linear_token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                          impl: str = "auto", block_rows: int | None = None, block_vocab: int | None = None,
                          block_hidden: int | None = None) -> torch.Tensor:
    """token_logprobs(hidden @ weight.T, labels) with the LM head fused in: the
    [..., V] logits are computed one [rows, vocab] tile at a time (each tile summed
    over slices of H) and never exist at once.

    hidden [..., H], weight [V, H] (an nn.Linear's weight), labels [...] -> [...] float32.
    Block sizes default to the device's configuration (kernels/_blocks.py); the
    block_* arguments override it (powers of two; >= 16 on a GPU).
    """
    if hidden.shape[:-1] != labels.shape or weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise UserError(f"linear_token_logprobs: shapes do not fit: hidden {tuple(hidden.shape)}, "
                        f"weight {tuple(weight.shape)}, labels {tuple(labels.shape)}")
    if labels.is_floating_point():
        raise UserError("linear_token_logprobs: labels must be integer token ids")
    if not use_pallas(impl, hidden.device):
        return ref.linear_token_logprobs(hidden, weight, labels)
    return _bridge().linear_token_logprobs(hidden, weight, labels, block_rows, block_vocab, block_hidden)
