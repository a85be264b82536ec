"""RMSNorm forward and backward as Pallas kernels over blocks of rows.

Memory-bound: each pass should read and write every element once. Forward:
one program per block of rows (a few rows at D=4096, see _blocks: a wider
tile spills registers), the whole feature dim at once; it writes y and the
per-row 1/rms that the backward reuses instead of a second reduction.
Backward: a fixed number of programs (a few per SM) each walks its share of
row blocks, writing dx and summing dy * x_hat into one float32 d weight
partial per program, which the wrapper adds up ([programs, D]: a few MiB,
so no atomics and no second pass over [N, D]).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from tpu_pipeline.kernels._common import acc_dtype, call, feature_dim, kernel_jit, lowering, pad_axis, round_up
from tpu_pipeline.kernels._blocks import RowBlocks


def _fwd_kernel(x_ref, w_ref, y_ref, rstd_ref, *, eps: float, d: int):
    acc = acc_dtype(x_ref.dtype)
    x = x_ref[...].astype(acc)
    w = w_ref[...].astype(acc)
    rstd = lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) / d + eps)
    y_ref[...] = (x * rstd * w).astype(y_ref.dtype)
    rstd_ref[...] = rstd


def _bwd_kernel(x_ref, w_ref, rstd_ref, dy_ref, dx_ref, dw_ref, *, d: int, br: int, steps: int):
    acc = acc_dtype(x_ref.dtype)
    w = w_ref[...].astype(acc)

    def body(r, dw):
        rs = pl.ds(pl.multiple_of(r * br, br), br)
        x = x_ref[rs, :].astype(acc)
        dy = dy_ref[rs, :].astype(acc)
        rstd = rstd_ref[rs, :]
        xhat = x * rstd
        g = dy * w
        c = jnp.sum(xhat * g, axis=-1, keepdims=True) / d
        dx_ref[rs, :] = (rstd * (g - xhat * c)).astype(dx_ref.dtype)
        return dw + jnp.sum(dy * xhat, axis=0, keepdims=True)

    dw_ref[...] = lax.fori_loop(0, steps, body, jnp.zeros(dw_ref.shape, acc)).astype(dw_ref.dtype)


@kernel_jit(static_argnames=("eps", "cfg", "interpret"))
def rms_norm_fwd(x: jax.Array, w: jax.Array, *, eps: float, cfg: RowBlocks,
                 interpret: bool) -> tuple[jax.Array, jax.Array]:
    """x [N, D], w [D] -> (y [N, D] in x.dtype, rstd [N, 1] float32/64)."""
    n, d = x.shape
    target = lowering(cfg, interpret)
    dp = feature_dim(d, target)
    acc = acc_dtype(x.dtype)
    br = cfg.rows
    n_p = round_up(n, br)
    xp = pad_axis(pad_axis(x, 0, n_p), 1, dp)
    row = pl.BlockSpec((br, dp), lambda i: (i, 0))
    col = pl.BlockSpec((br, 1), lambda i: (i, 0))
    y, rstd = call(
        functools.partial(_fwd_kernel, eps=eps, d=d), grid=(n_p // br,),
        in_specs=[row, pl.BlockSpec((1, dp), lambda i: (0, 0))], out_specs=[row, col],
        out_shape=[jax.ShapeDtypeStruct((n_p, dp), x.dtype), jax.ShapeDtypeStruct((n_p, 1), acc)],
        target=target, name="rms_norm_fwd", launch=(cfg.num_warps, 1),
    )(xp, pad_axis(w.reshape(1, d), 1, dp))
    return y[:n, :d], rstd[:n]


def bwd_split(n: int, rows: int, programs: int) -> tuple[int, int]:
    """(programs, row blocks per program) covering n rows with as little padding as the
    target number of programs allows (padding copies x and dy)."""
    nb = -(-n // rows)
    steps = -(-nb // max(1, min(programs, nb)))
    return -(-nb // steps), steps


@kernel_jit(static_argnames=("cfg", "interpret"))
def rms_norm_bwd(x: jax.Array, w: jax.Array, rstd: jax.Array, dy: jax.Array, *, cfg: RowBlocks,
                 interpret: bool) -> tuple[jax.Array, jax.Array]:
    """-> (dx [N, D] in x.dtype, dw [D] in w.dtype)."""
    n, d = x.shape
    target = lowering(cfg, interpret)
    dp = feature_dim(d, target)
    acc = acc_dtype(x.dtype)
    br = cfg.rows
    progs, steps = bwd_split(n, br, cfg.programs)
    span = br * steps
    n_p = progs * span
    # Padded rows carry dy = 0, so they add nothing to dw.
    xp, dyp = pad_axis(pad_axis(x, 0, n_p), 1, dp), pad_axis(pad_axis(dy, 0, n_p), 1, dp)
    rp = pad_axis(rstd, 0, n_p, 1.0)
    row = pl.BlockSpec((span, dp), lambda i: (i, 0))
    col = pl.BlockSpec((span, 1), lambda i: (i, 0))
    # One [1, D] partial per program, as a [programs, 1, D] array: a (1, D) block of a
    # [programs, D] array breaks TPU's rule that a block's last two dims are multiples
    # of (8, 128) or whole; here they are whole.
    dx, dw_part = call(
        functools.partial(_bwd_kernel, d=d, br=br, steps=steps), grid=(progs,),
        in_specs=[row, pl.BlockSpec((1, dp), lambda i: (0, 0)), col, row],
        out_specs=[row, pl.BlockSpec((None, 1, dp), lambda i: (i, 0, 0))],
        out_shape=[jax.ShapeDtypeStruct((n_p, dp), x.dtype), jax.ShapeDtypeStruct((progs, 1, dp), acc)],
        target=target, name="rms_norm_bwd", launch=(cfg.num_warps, 2),
    )(xp, pad_axis(w.reshape(1, d), 1, dp), rp, dyp)
    return dx[:n, :d], jnp.sum(dw_part, axis=(0, 1))[:d].astype(w.dtype)
