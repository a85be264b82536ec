"""Plain PyTorch references: what `impl="torch"` runs and what the kernels are tested against.

Each computes in float32 (or float64 when given float64) and returns the input's dtype,
the same contract the Pallas kernels keep.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.to(_acc(x.dtype))
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.to(xf.dtype)).to(x.dtype)


def flash_attention(q, k, v, causal: bool = True, sm_scale: float | None = None,
                    kv_start: torch.Tensor | None = None) -> torch.Tensor:
    """[B, Hq, Sq, D] x [B, Hkv, Sk, D] -> [B, Hq, Sq, D]; causal is aligned bottom-right
    (query i sees keys j <= i + Sk - Sq), which is what decoding with a KV cache needs.
    kv_start [B]: keys before it are left padding. Rows that see no key return 0."""
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    if Hq % Hkv:
        raise ValueError(f"query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")
    scale = D ** -0.5 if sm_scale is None else sm_scale
    acc = _acc(q.dtype)
    kf = k.to(acc).repeat_interleave(Hq // Hkv, dim=1)
    vf = v.to(acc).repeat_interleave(Hq // Hkv, dim=1)
    s = torch.matmul(q.to(acc), kf.transpose(-1, -2)) * scale
    i = torch.arange(Sq, device=q.device)[:, None]
    j = torch.arange(Sk, device=q.device)[None, :]
    visible = (j <= i + (Sk - Sq)) if causal else torch.ones(Sq, Sk, dtype=torch.bool, device=q.device)
    visible = visible[None, None]
    if kv_start is not None:
        visible = visible & (j >= kv_start.view(B, 1, 1, 1).to(q.device))
    # Rows with every key masked give 0 (and a zero, not NaN, gradient): their scores are
    # zeroed before the softmax so it stays finite, and the row is dropped after.
    seen = visible.any(-1, keepdim=True)
    s = torch.where(seen, s.masked_fill(~visible, float("-inf")), 0.0)
    p = torch.where(seen, torch.softmax(s, dim=-1), 0.0)
    return torch.matmul(p, vf).to(q.dtype)


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[..., V] logits, [...] labels -> [...] float32 log-probabilities; labels < 0 give 0."""
    lp = F.log_softmax(logits.to(_acc(logits.dtype)), dim=-1)
    safe = labels.clamp_min(0).long()
    out = lp.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    return out.masked_fill(labels < 0, 0.0)


def linear_token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log_softmax(hidden @ weight.T)[labels]: [..., H], [V, H], [...] -> [...] float32."""
    acc = _acc(hidden.dtype)
    logits = torch.matmul(hidden.to(acc), weight.to(acc).t())
    return token_logprobs(logits, labels)
