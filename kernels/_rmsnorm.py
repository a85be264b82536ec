"""RMSNorm forward and backward as Pallas kernels over blocks of rows.

Forward: one program per block of `block_rows` rows; the whole feature dim is
one block. It writes y and the per-row 1/rms that backward reuses.
Backward: dx per row block, and per-block partial sums of dy * x_hat for dweight
that the wrapper adds up (a reduction across programs needs no atomics then).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from tpu_pipeline.kernels._common import acc_dtype, call, feature_dim, kernel_jit, pad_axis, round_up


def _fwd_kernel(x_ref, w_ref, y_ref, rstd_ref, *, eps: float, d: int):
    acc = acc_dtype(x_ref.dtype)
    x = x_ref[...].astype(acc)
    w = w_ref[...].astype(acc)
    rstd = lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) / d + eps)
    y_ref[...] = (x * rstd * w).astype(y_ref.dtype)
    rstd_ref[...] = rstd


def _bwd_kernel(x_ref, w_ref, rstd_ref, dy_ref, dx_ref, dw_ref, *, d: int):
    acc = acc_dtype(x_ref.dtype)
    x = x_ref[...].astype(acc)
    w = w_ref[...].astype(acc)
    dy = dy_ref[...].astype(acc)
    rstd = rstd_ref[...]
    xhat = x * rstd
    g = dy * w
    c = jnp.sum(xhat * g, axis=-1, keepdims=True) / d
    dx_ref[...] = (rstd * (g - xhat * c)).astype(dx_ref.dtype)
    dw_ref[...] = jnp.sum(dy * xhat, axis=0, keepdims=True).astype(dw_ref.dtype)


@kernel_jit(static_argnames=("eps", "block_rows", "interpret"))
def rms_norm_fwd(x, w, *, eps: float, block_rows: int, interpret: bool):
    """x [N, D], w [D] -> (y [N, D] in x.dtype, rstd [N, 1] float32/64)."""
    n, d = x.shape
    dp = feature_dim(d, interpret)
    acc = acc_dtype(x.dtype)
    br = min(block_rows, round_up(n, 8))
    n_p = round_up(n, br)
    xp = pad_axis(pad_axis(x, 0, n_p), 1, dp)
    row = pl.BlockSpec((br, dp), lambda i: (i, 0))
    col = pl.BlockSpec((br, 1), lambda i: (i, 0))
    y, rstd = call(
        functools.partial(_fwd_kernel, eps=eps, d=d), grid=(n_p // br,),
        in_specs=[row, pl.BlockSpec((1, dp), lambda i: (0, 0))], out_specs=[row, col],
        out_shape=[jax.ShapeDtypeStruct((n_p, dp), x.dtype), jax.ShapeDtypeStruct((n_p, 1), acc)],
        interpret=interpret, name="rms_norm_fwd",
    )(xp, pad_axis(w.reshape(1, d), 1, dp))
    return y[:n, :d], rstd[:n]


@kernel_jit(static_argnames=("block_rows", "interpret"))
def rms_norm_bwd(x, w, rstd, dy, *, block_rows: int, interpret: bool):
    """-> (dx [N, D] in x.dtype, dw [D] in w.dtype)."""
    n, d = x.shape
    dp = feature_dim(d, interpret)
    acc = acc_dtype(x.dtype)
    br = min(block_rows, round_up(n, 8))
    n_p = round_up(n, br)
    nb = n_p // br
    # Padded rows carry dy = 0, so they add nothing to dw.
    xp, dyp = pad_axis(pad_axis(x, 0, n_p), 1, dp), pad_axis(pad_axis(dy, 0, n_p), 1, dp)
    rp = pad_axis(rstd, 0, n_p, 1.0)
    row = pl.BlockSpec((br, dp), lambda i: (i, 0))
    col = pl.BlockSpec((br, 1), lambda i: (i, 0))
    dx, dw_part = call(
        functools.partial(_bwd_kernel, d=d), grid=(nb,),
        in_specs=[row, pl.BlockSpec((1, dp), lambda i: (0, 0)), col, row],
        out_specs=[row, pl.BlockSpec((1, dp), lambda i: (i, 0))],
        out_shape=[jax.ShapeDtypeStruct((n_p, dp), x.dtype), jax.ShapeDtypeStruct((nb, dp), acc)],
        interpret=interpret, name="rms_norm_bwd",
    )(xp, pad_axis(w.reshape(1, d), 1, dp), rp, dyp)
    return dx[:n, :d], jnp.sum(dw_part, axis=0)[:d].astype(w.dtype)
