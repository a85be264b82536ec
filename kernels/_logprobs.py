"""Token log-probabilities without the softmax: Pallas kernels chunked over the vocabulary.

token_logprobs: one program per block of rows walks the vocabulary in chunks
with an online log-sum-exp and picks the label's logit on the way; output is
logit[label] - lse. Backward writes d logits = g * (onehot - exp(logit - lse))
block by block (that tensor is the gradient's own shape, nothing more).

linear_token_logprobs fuses the LM head: each vocabulary chunk's logits are
hidden_block @ weight_chunk^T, made and consumed inside the kernel, so the
[N, V] logits never exist. Backward recomputes them chunk by chunk: one kernel
per row block accumulates d hidden, one per vocabulary block accumulates
d weight.

Labels < 0 (padding, e.g. -100) give 0 and no gradient.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from tpu_pipeline.kernels._common import NEG, acc_dtype, call, dot_nn, dot_nt, dot_tn, feature_dim, kernel_jit, pad_axis, round_up


def _lse_step(carry, s, cols, lab):
    """One vocabulary chunk of the online log-sum-exp and the label pick."""
    m, l, picked = carry
    m_new = jnp.maximum(m, jnp.max(s, axis=-1, keepdims=True))
    l = jnp.exp(m - m_new) * l + jnp.sum(jnp.exp(s - m_new), axis=-1, keepdims=True)
    picked = picked + jnp.sum(jnp.where(cols == lab, s, 0.0), axis=-1, keepdims=True)
    return m_new, l, picked


def _finish(carry, lab, lp_ref, lse_ref):
    m, l, picked = carry
    lse = m + jnp.log(l)
    lp_ref[...] = jnp.where(lab >= 0, picked - lse, 0.0).astype(lp_ref.dtype)
    lse_ref[...] = lse.astype(lse_ref.dtype)


def _init(br, acc):
    return jnp.full((br, 1), NEG, acc), jnp.zeros((br, 1), acc), jnp.zeros((br, 1), acc)


def _tl_fwd_kernel(x_ref, lab_ref, lp_ref, lse_ref, *, bv, v, nv):
    acc = lp_ref.dtype
    br = x_ref.shape[0]
    lab = lab_ref[...]
    cols0 = lax.broadcasted_iota(jnp.int32, (br, bv), 1)

    def body(c, carry):
        cols = c * bv + cols0
        s = jnp.where(cols < v, x_ref[:, pl.ds(pl.multiple_of(c * bv, bv), bv)].astype(acc), NEG)
        return _lse_step(carry, s, cols, lab)

    _finish(lax.fori_loop(0, nv, body, _init(br, acc)), lab, lp_ref, lse_ref)


def _tl_bwd_kernel(x_ref, lab_ref, lse_ref, g_ref, dx_ref, *, bv):
    acc = lse_ref.dtype
    lab = lab_ref[...]
    cols = pl.program_id(1) * bv + lax.broadcasted_iota(jnp.int32, x_ref.shape, 1)
    p = jnp.exp(x_ref[...].astype(acc) - lse_ref[...])
    g = jnp.where(lab >= 0, g_ref[...], 0.0)
    dx_ref[...] = (g * (jnp.where(cols == lab, 1.0, 0.0) - p)).astype(dx_ref.dtype)


def _rows(n, block_rows):
    br = min(block_rows, round_up(n, 8))
    return br, round_up(n, br)


def _vocab(v, block_vocab):
    bv = min(block_vocab, round_up(v, 128))
    return bv, round_up(v, bv)


_STATIC = ("block_rows", "block_vocab", "interpret")


@kernel_jit(static_argnames=_STATIC)
def token_logprobs_fwd(x, labels, *, block_rows: int, block_vocab: int, interpret: bool):
    """x [N, V], labels [N] int32 -> (logprobs [N], lse [N]) in float32 (float64 for float64 x)."""
    n, v = x.shape
    acc = acc_dtype(x.dtype)
    br, n_p = _rows(n, block_rows)
    bv, v_p = _vocab(v, block_vocab)
    xp = pad_axis(pad_axis(x, 0, n_p), 1, v_p)
    lab = pad_axis(labels.reshape(n, 1), 0, n_p, -1)
    col = pl.BlockSpec((br, 1), lambda i: (i, 0))
    lp, lse = call(
        functools.partial(_tl_fwd_kernel, bv=bv, v=v, nv=v_p // bv), grid=(n_p // br,),
        in_specs=[pl.BlockSpec((br, v_p), lambda i: (i, 0)), col], out_specs=[col, col],
        out_shape=[jax.ShapeDtypeStruct((n_p, 1), acc)] * 2,
        interpret=interpret, name="token_logprobs_fwd",
    )(xp, lab)
    return lp[:n, 0], lse[:n, 0]


@kernel_jit(static_argnames=_STATIC)
def token_logprobs_bwd(x, labels, lse, g, *, block_rows: int, block_vocab: int, interpret: bool):
    """-> d x [N, V] in x.dtype."""
    n, v = x.shape
    br, n_p = _rows(n, block_rows)
    bv, v_p = _vocab(v, block_vocab)
    xp = pad_axis(pad_axis(x, 0, n_p), 1, v_p)
    col = pl.BlockSpec((br, 1), lambda i, c: (i, 0))
    blk = pl.BlockSpec((br, bv), lambda i, c: (i, c))
    (dx,) = call(
        functools.partial(_tl_bwd_kernel, bv=bv), grid=(n_p // br, v_p // bv),
        in_specs=[blk, col, col, col], out_specs=[blk],
        out_shape=[jax.ShapeDtypeStruct((n_p, v_p), x.dtype)],
        interpret=interpret, name="token_logprobs_bwd",
    )(xp, pad_axis(labels.reshape(n, 1), 0, n_p, -1), pad_axis(lse.reshape(n, 1), 0, n_p),
      pad_axis(g.reshape(n, 1).astype(lse.dtype), 0, n_p))
    return dx[:n, :v]


def _ltl_fwd_kernel(h_ref, w_ref, lab_ref, lp_ref, lse_ref, *, bv, v, nv):
    acc = lp_ref.dtype
    h = h_ref[...]
    br = h.shape[0]
    lab = lab_ref[...]
    cols0 = lax.broadcasted_iota(jnp.int32, (br, bv), 1)

    def body(c, carry):
        cols = c * bv + cols0
        s = jnp.where(cols < v, dot_nt(h, w_ref[pl.ds(pl.multiple_of(c * bv, bv), bv), :], acc), NEG)
        return _lse_step(carry, s, cols, lab)

    _finish(lax.fori_loop(0, nv, body, _init(br, acc)), lab, lp_ref, lse_ref)


def _dlogits(h, w, lab, lse, g, cols, v, acc):
    """g * (onehot(label) - softmax) for one [rows, vocab chunk] tile, recomputed from h and w."""
    p = jnp.exp(dot_nt(h, w, acc) - lse)
    d = g * (jnp.where(cols == lab, 1.0, 0.0) - p)
    return jnp.where((cols < v) & (lab >= 0), d, 0.0)


def _ltl_dh_kernel(h_ref, w_ref, lab_ref, lse_ref, g_ref, dh_ref, *, bv, v, nv):
    acc = lse_ref.dtype
    h, lab, lse, g = h_ref[...], lab_ref[...], lse_ref[...], g_ref[...]
    cols0 = lax.broadcasted_iota(jnp.int32, (h.shape[0], bv), 1)

    def body(c, dh):
        w = w_ref[pl.ds(pl.multiple_of(c * bv, bv), bv), :]
        d = _dlogits(h, w, lab, lse, g, c * bv + cols0, v, acc)
        return dh + dot_nn(d.astype(w.dtype), w, acc)

    dh_ref[...] = lax.fori_loop(0, nv, body, jnp.zeros(h.shape, acc)).astype(dh_ref.dtype)


def _ltl_dw_kernel(h_ref, w_ref, lab_ref, lse_ref, g_ref, dw_ref, *, br, v, nr):
    acc = lse_ref.dtype
    w = w_ref[...]
    bv = w.shape[0]
    cols = pl.program_id(0) * bv + lax.broadcasted_iota(jnp.int32, (br, bv), 1)

    def body(r, dw):
        sl = pl.ds(pl.multiple_of(r * br, br), br)
        h = h_ref[sl, :]
        d = _dlogits(h, w, lab_ref[sl, :], lse_ref[sl, :], g_ref[sl, :], cols, v, acc)
        return dw + dot_tn(d.astype(h.dtype), h, acc)

    dw_ref[...] = lax.fori_loop(0, nr, body, jnp.zeros(w.shape, acc)).astype(dw_ref.dtype)


@kernel_jit(static_argnames=_STATIC)
def linear_token_logprobs_fwd(h, w, labels, *, block_rows: int, block_vocab: int, interpret: bool):
    """h [N, H], w [V, H], labels [N] -> (logprobs [N], lse [N]) float32 (float64 for float64 h)."""
    n, d_real = h.shape
    d = feature_dim(d_real, interpret)
    h, w = pad_axis(h, 1, d), pad_axis(w, 1, d)
    v = w.shape[0]
    acc = acc_dtype(h.dtype)
    br, n_p = _rows(n, block_rows)
    bv, v_p = _vocab(v, block_vocab)
    col = pl.BlockSpec((br, 1), lambda i: (i, 0))
    lp, lse = call(
        functools.partial(_ltl_fwd_kernel, bv=bv, v=v, nv=v_p // bv), grid=(n_p // br,),
        in_specs=[pl.BlockSpec((br, d), lambda i: (i, 0)), pl.BlockSpec((v_p, d), lambda i: (0, 0)), col],
        out_specs=[col, col], out_shape=[jax.ShapeDtypeStruct((n_p, 1), acc)] * 2,
        interpret=interpret, name="linear_token_logprobs_fwd",
    )(pad_axis(h, 0, n_p), pad_axis(w, 0, v_p), pad_axis(labels.reshape(n, 1), 0, n_p, -1))
    return lp[:n, 0], lse[:n, 0]


@kernel_jit(static_argnames=_STATIC)
def linear_token_logprobs_bwd(h, w, labels, lse, g, *, block_rows: int, block_vocab: int, interpret: bool):
    """-> (d h [N, H] in h.dtype, d w [V, H] in w.dtype)."""
    n, d_real = h.shape
    d = feature_dim(d_real, interpret)
    v = w.shape[0]
    br, n_p = _rows(n, block_rows)
    bv, v_p = _vocab(v, block_vocab)
    hp, wp = pad_axis(pad_axis(h, 0, n_p), 1, d), pad_axis(pad_axis(w, 0, v_p), 1, d)
    labp = pad_axis(labels.reshape(n, 1), 0, n_p, -1)
    lsep = pad_axis(lse.reshape(n, 1), 0, n_p)
    gp = pad_axis(g.reshape(n, 1).astype(lse.dtype), 0, n_p)

    col = pl.BlockSpec((br, 1), lambda i: (i, 0))
    (dh,) = call(
        functools.partial(_ltl_dh_kernel, bv=bv, v=v, nv=v_p // bv), grid=(n_p // br,),
        in_specs=[pl.BlockSpec((br, d), lambda i: (i, 0)), pl.BlockSpec((v_p, d), lambda i: (0, 0)), col, col, col],
        out_specs=[pl.BlockSpec((br, d), lambda i: (i, 0))],
        out_shape=[jax.ShapeDtypeStruct((n_p, d), h.dtype)],
        interpret=interpret, name="linear_token_logprobs_dh",
    )(hp, wp, labp, lsep, gp)

    colfull = pl.BlockSpec((n_p, 1), lambda j: (0, 0))
    (dw,) = call(
        functools.partial(_ltl_dw_kernel, br=br, v=v, nr=n_p // br), grid=(v_p // bv,),
        in_specs=[pl.BlockSpec((n_p, d), lambda j: (0, 0)), pl.BlockSpec((bv, d), lambda j: (j, 0)),
                  colfull, colfull, colfull],
        out_specs=[pl.BlockSpec((bv, d), lambda j: (j, 0))],
        out_shape=[jax.ShapeDtypeStruct((v_p, d), w.dtype)],
        interpret=interpret, name="linear_token_logprobs_dw",
    )(hp, wp, labp, lsep, gp)
    return dh[:n, :d_real], dw[:v, :d_real]
