"""Causal flash attention, forward and backward, as Pallas kernels.

Layout [B, H, S, D]. One program per (batch, query head, query block); it
walks the key blocks with an online softmax (running max m, running sum l,
unnormalised accumulator), so the [Sq, Sk] score matrix never exists. Causal
masking is aligned bottom-right (query i sees keys j <= i + Sk - Sq) and the
walk stops at the last key block a query block can see. Grouped-query
attention maps query head h to key/value head h // (Hq / Hkv) in the
BlockSpec index maps. Ragged lengths are padded to whole blocks and the
padded keys masked out; left padding (per batch row, the first key in use)
is masked too, so left-padded batches and their KV-cache decode steps run
here.

Backward (FlashAttention-2 style, recomputing probabilities from the saved
log-sum-exp): one kernel per query block for dq, one per key block for dk and
dv (per key/value head, summing over the query heads of its group in registers).

Block sizes, warps and pipeline stages come from _blocks per device, head dim
and direction (forward 128x64, backward 64x64 on an H100/H200 at d <= 128).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from tpu_pipeline.kernels._common import (NEG, acc_dtype, call, dot_nn, dot_nt, dot_tn, feature_dim, kernel_jit,
                                         lowering, pad_axis, read_row_scalar, round_up, row_scalars_spec)
from tpu_pipeline.kernels._blocks import AttentionBlocks, fit_block


def _div0(a, b: int):
    """a // b for a >= 0, and 0 for a < 0 (every caller clips the result at 0).

    A traced `//` is a floor division, whose Mosaic lowering needs jnp.sign, and that
    asks JAX for the TPU's generation: it does not lower without a TPU (jax.export
    here, or torch-tpu's jax_op in a process whose JAX runs on CPU). lax.div
    truncates, which is the same for a >= 0."""
    a = jnp.maximum(a, 0)
    return lax.div(a, jnp.asarray(b, a.dtype))


def _mask(rows, cols, *, start, sk, offset, causal: bool):
    m = (cols < sk) & (cols >= start)
    if causal:
        m = m & (cols <= rows + offset)
    return m


def _fwd_kernel(bnd_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, scale, causal, bq, bk, sq, nk, target):
    acc = acc_dtype(q_ref.dtype)
    qi = pl.program_id(2)
    start, sk = read_row_scalar(bnd_ref, 0, target), read_row_scalar(bnd_ref, 1, target)
    offset = sk - sq
    q = q_ref[...]
    rows = qi * bq + lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
    cols0 = lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
    hi = jnp.clip(_div0(qi * bq + bq + offset + bk - 1, bk), 0, nk) if causal else nk

    def body(j, carry):
        m, l, o = carry
        k = k_ref[pl.ds(pl.multiple_of(j * bk, bk), bk), :]
        v = v_ref[pl.ds(pl.multiple_of(j * bk, bk), bk), :]
        s = dot_nt(q, k, acc) * scale
        mask = _mask(rows, j * bk + cols0, start=start, sk=sk, offset=offset, causal=causal)
        s = jnp.where(mask, s, NEG)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1, keepdims=True))
        p = jnp.where(mask, jnp.exp(s - m_new), 0.0)
        alpha = jnp.exp(m - m_new)
        l = alpha * l + jnp.sum(p, axis=-1, keepdims=True)
        o = alpha * o + dot_nn(p.astype(v.dtype), v, acc)
        return m_new, l, o

    d = q.shape[-1]
    init = (jnp.full((bq, 1), NEG, acc), jnp.zeros((bq, 1), acc), jnp.zeros((bq, d), acc))
    # Key blocks wholly inside the left padding are skipped.
    m, l, o = lax.fori_loop(jnp.minimum(_div0(start, bk), hi), hi, body, init)
    seen = l > 0
    l_safe = jnp.where(seen, l, 1.0)
    o_ref[...] = (o / l_safe).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(seen, m + jnp.log(l_safe), 0.0)


def _dq_kernel(bnd_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, *, scale, causal, bq, bk, sq, nk,
               target):
    acc = acc_dtype(q_ref.dtype)
    qi = pl.program_id(2)
    start, sk = read_row_scalar(bnd_ref, 0, target), read_row_scalar(bnd_ref, 1, target)
    offset = sk - sq
    q, do = q_ref[...], do_ref[...]
    lse, delta = lse_ref[...], delta_ref[...]  # [bq, 1]
    rows = qi * bq + lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
    cols0 = lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
    hi = jnp.clip(_div0(qi * bq + bq + offset + bk - 1, bk), 0, nk) if causal else nk

    def body(j, dq):
        k = k_ref[pl.ds(pl.multiple_of(j * bk, bk), bk), :]
        v = v_ref[pl.ds(pl.multiple_of(j * bk, bk), bk), :]
        mask = _mask(rows, j * bk + cols0, start=start, sk=sk, offset=offset, causal=causal)
        p = jnp.where(mask, jnp.exp(dot_nt(q, k, acc) * scale - lse), 0.0)
        ds = p * (dot_nt(do, v, acc) - delta)
        return dq + dot_nn(ds.astype(k.dtype), k, acc)

    dq = lax.fori_loop(jnp.minimum(_div0(start, bk), hi), hi, body, jnp.zeros(q.shape, acc))
    dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _dkv_kernel(bnd_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, *,
                scale, causal, bq, bk, sq, nq, g, target):
    """Program (b, kv head, key block): walks the query blocks of every query head of
    its group (grouped-query attention), so dk and dv are summed here, not as
    per-query-head partials in memory."""
    acc = acc_dtype(q_ref.dtype)
    kj = pl.program_id(2)
    start, sk = read_row_scalar(bnd_ref, 0, target), read_row_scalar(bnd_ref, 1, target)
    offset = sk - sq
    k, v = k_ref[...], v_ref[...]
    rows0 = lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
    cols = kj * bk + lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
    # First query block with a row that can see this key block: i + offset >= kj * bk.
    lo = jnp.clip(_div0(kj * bk - offset, bq), 0, nq) if causal else 0

    def head(hh, carry):
        def body(i, carry):
            dk, dv = carry
            qs = pl.ds(pl.multiple_of(i * bq, bq), bq)
            q, do = q_ref[hh, qs, :], do_ref[hh, qs, :]
            lse, delta = lse_ref[hh, qs, :], delta_ref[hh, qs, :]  # [bq, 1]
            rows = i * bq + rows0
            mask = _mask(rows, cols, start=start, sk=sk, offset=offset, causal=causal) & (rows < sq)
            p = jnp.where(mask, jnp.exp(dot_nt(q, k, acc) * scale - lse), 0.0)
            dv = dv + dot_tn(p.astype(do.dtype), do, acc)
            ds = p * (dot_nt(do, v, acc) - delta)
            dk = dk + dot_tn(ds.astype(q.dtype), q, acc)
            return dk, dv

        return lax.fori_loop(lo, nq, body, carry)

    zeros = jnp.zeros(k.shape, acc)
    dk, dv = lax.fori_loop(0, g, head, (zeros, zeros))
    dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _geometry(q, k, cfg: AttentionBlocks):
    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    bq = fit_block(cfg.q, sq)
    bk = fit_block(cfg.k, sk)
    return b, hq, hkv, sq, sk, d, bq, bk, round_up(sq, bq), round_up(sk, bk)


def kv_bucket(sk: int, block_k: int) -> int:
    """Key length the caller pads k/v to, so that a growing KV cache (one more key per
    decode step) reuses one compiled kernel per bucket instead of compiling per step."""
    return round_up(sk, block_k) if sk > block_k else fit_block(block_k, sk)


_STATIC = ("causal", "scale", "cfg", "interpret")


@kernel_jit(static_argnames=_STATIC)
def attention_fwd(q: jax.Array, k: jax.Array, v: jax.Array, bounds: jax.Array, *, causal: bool, scale: float,
                  cfg: AttentionBlocks, interpret: bool) -> tuple[jax.Array, jax.Array]:
    """q [B, Hq, Sq, D], k/v [B, Hkv, Sk, D] -> (o [B, Hq, Sq, D], lse [B, Hq, Sq] float32/64).

    bounds: int32 [B, 2], per batch row the first and one-past-last key in use: keys
    before the first are left padding, keys from the last on are bucket padding. They
    are data, not compile-time constants, so decode steps of one bucket share a
    compiled kernel. Causal alignment counts from the last key in use.

    The kernel writes lse as [B, Hq, Sq, 1] ([bq, 1] blocks): a [bq] block of a
    [B, Hq, Sq] array breaks TPU's rule that a block's last two dims are multiples of
    (8, 128) or whole (there they would be a squeezed head and bq).
    """
    b, hq, hkv, sq, sk, d_real, bq, bk, sq_p, sk_p = _geometry(q, k, cfg)
    g = hq // hkv
    target = lowering(cfg, interpret)
    d = feature_dim(d_real, target)
    qp, kp, vp = (pad_axis(pad_axis(t, 2, s), 3, d) for t, s in ((q, sq_p), (k, sk_p), (v, sk_p)))
    kern = functools.partial(_fwd_kernel, scale=scale, causal=causal, bq=bq, bk=bk, sq=sq, nk=sk_p // bk,
                             target=target)
    qspec = pl.BlockSpec((None, None, bq, d), lambda bi, h, i: (bi, h, i, 0))
    kvspec = pl.BlockSpec((None, None, sk_p, d), lambda bi, h, i: (bi, _div0(h, g), 0, 0))
    o, lse = call(
        kern, grid=(b, hq, sq_p // bq), in_specs=[row_scalars_spec(2, target), qspec, kvspec, kvspec],
        out_specs=[qspec, pl.BlockSpec((None, None, bq, 1), lambda bi, h, i: (bi, h, i, 0))],
        out_shape=[jax.ShapeDtypeStruct((b, hq, sq_p, d), q.dtype),
                   jax.ShapeDtypeStruct((b, hq, sq_p, 1), acc_dtype(q.dtype))],
        target=target, name="flash_attention_fwd", launch=(cfg.num_warps, cfg.num_stages),
    )(bounds, qp, kp, vp)
    return o[:, :, :sq, :d_real], lse[:, :, :sq, 0]


@kernel_jit(static_argnames=_STATIC)
def attention_bwd(q: jax.Array, k: jax.Array, v: jax.Array, bounds: jax.Array, o: jax.Array, lse: jax.Array,
                  do: jax.Array, *, causal: bool, scale: float, cfg: AttentionBlocks,
                  interpret: bool) -> tuple[jax.Array, jax.Array, jax.Array]:
    """-> (dq, dk, dv) shaped like q, k, v. lse and delta enter the kernels as
    [B, Hq, Sq, 1] (see attention_fwd for why)."""
    b, hq, hkv, sq, sk, d_real, bq, bk, sq_p, sk_p = _geometry(q, k, cfg)
    g = hq // hkv
    target = lowering(cfg, interpret)
    d = feature_dim(d_real, target)
    acc = acc_dtype(q.dtype)
    # delta_i = sum_d o_i * do_i: the row term of softmax's backward, shared by both kernels.
    delta = jnp.sum(o.astype(acc) * do.astype(acc), axis=-1)
    qp, dop, kp, vp = (pad_axis(pad_axis(t, 2, s), 3, d) for t, s in ((q, sq_p), (do, sq_p), (k, sk_p), (v, sk_p)))
    lsep, deltap = pad_axis(lse[..., None], 2, sq_p), pad_axis(delta[..., None], 2, sq_p)
    common = dict(scale=scale, causal=causal, bq=bq, bk=bk, sq=sq, target=target)

    qblk = pl.BlockSpec((None, None, bq, d), lambda bi, h, i: (bi, h, i, 0))
    rowblk = pl.BlockSpec((None, None, bq, 1), lambda bi, h, i: (bi, h, i, 0))
    kvfull = pl.BlockSpec((None, None, sk_p, d), lambda bi, h, i: (bi, _div0(h, g), 0, 0))
    (dq,) = call(
        functools.partial(_dq_kernel, nk=sk_p // bk, **common), grid=(b, hq, sq_p // bq),
        in_specs=[row_scalars_spec(2, target), qblk, kvfull, kvfull, qblk, rowblk, rowblk], out_specs=[qblk],
        out_shape=[jax.ShapeDtypeStruct((b, hq, sq_p, d), q.dtype)],
        target=target, name="flash_attention_dq", launch=(cfg.num_warps, cfg.num_stages),
    )(bounds, qp, kp, vp, dop, lsep, deltap)

    # The query heads of kv head h are h * g ... h * g + g - 1: one block of g heads.
    qgroup = pl.BlockSpec((None, g, sq_p, d), lambda bi, h, j: (bi, h, 0, 0))
    rowgroup = pl.BlockSpec((None, g, sq_p, 1), lambda bi, h, j: (bi, h, 0, 0))
    kvblk = pl.BlockSpec((None, None, bk, d), lambda bi, h, j: (bi, h, j, 0))
    dk, dv = call(
        functools.partial(_dkv_kernel, nq=sq_p // bq, g=g, **common), grid=(b, hkv, sk_p // bk),
        in_specs=[row_scalars_spec(2, target), qgroup, kvblk, kvblk, qgroup, rowgroup, rowgroup],
        out_specs=[kvblk, kvblk], out_shape=[jax.ShapeDtypeStruct((b, hkv, sk_p, d), k.dtype)] * 2,
        target=target, name="flash_attention_dkv", launch=(cfg.num_warps, cfg.num_stages),
    )(bounds, qp, kp, vp, dop, lsep, deltap)
    return dq[:, :, :sq, :d_real], dk[:, :, :sk, :d_real], dv[:, :, :sk, :d_real]
