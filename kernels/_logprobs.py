"""Token log-probabilities without the softmax: Pallas kernels chunked over the vocabulary.

token_logprobs: one program per block of rows walks the vocabulary in chunks
with an online log-sum-exp and picks the label's logit on the way; output is
logit[label] - lse. Backward writes d logits = g * (onehot - exp(logit - lse))
block by block (that tensor is the gradient's own shape, nothing more).

linear_token_logprobs fuses the LM head: each [rows, vocab] tile of logits is
hidden_rows @ weight_tile^T, accumulated over slices of the hidden dimension
(so no tile grows with H: H=8192 and V=256k fit a GPU's shared memory), made
and consumed inside the kernel; the [N, V] logits never exist. The forward
walks the vocabulary with an online log-sum-exp; the vocabulary is split
across programs too (flash-decoding style), so that a few row blocks still
fill every SM, and the splits' partial log-sum-exps are merged afterwards. The backward recomputes each
tile's logits from h, w and the saved log-sum-exp, forms d logits =
g * (onehot - softmax) for the tile and adds d @ w into d hidden and
d^T @ h into d weight, slice by slice of H:
  - atomics (GPU): one kernel over (row block, vocab block) tiles adds both with
    atomic float32 adds: 3 matmuls' work, like torch's unfused backward plus
    the recomputation, in any order (not bit-reproducible run to run);
  - without atomics (TPU, or asked for): one kernel per row block owns its rows
    of d hidden, one per vocabulary block its rows of d weight; each recomputes
    the logits (4 matmuls' work), deterministic.
Block sizes come from _blocks (per device; see there for why).

Labels < 0 (padding, e.g. -100) give 0 and no gradient.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from tpu_pipeline.kernels._common import (NEG, acc_dtype, call, dot_nn, dot_nt, dot_tn, kernel_jit, lowering, pad_axis,
                                         round_up)
from tpu_pipeline.kernels._blocks import LinearLogprobsBlocks, VocabBlocks

try:
    from jax.experimental.pallas import triton as plgpu
except ImportError:  # a JAX without Pallas's Triton backend: only the atomics-free backward runs
    plgpu = None


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


def _tl_bwd_kernel(x_ref, lab_ref, lse_ref, g_ref, dx_ref):
    acc = lse_ref.dtype
    lab = lab_ref[...]
    cols = pl.program_id(1) * x_ref.shape[1] + lax.broadcasted_iota(jnp.int32, x_ref.shape, 1)
    p = jnp.exp(x_ref[...].astype(acc) - lse_ref[...])
    g = jnp.where(lab >= 0, g_ref[...], 0.0)
    dx_ref[...] = (g * (jnp.where(cols == lab, 1.0, 0.0) - p)).astype(dx_ref.dtype)


def _launch(cfg) -> tuple[int, int]:
    return cfg.num_warps, cfg.num_stages


@kernel_jit(static_argnames=("cfg", "interpret"))
def token_logprobs_fwd(x: jax.Array, labels: jax.Array, *, cfg: VocabBlocks,
                       interpret: bool) -> tuple[jax.Array, jax.Array]:
    """x [N, V], labels [N] int32 -> (logprobs [N], lse [N]) in float32 (float64 for float64 x)."""
    n, v = x.shape
    acc = acc_dtype(x.dtype)
    br, bv = cfg.rows, cfg.vocab
    n_p, v_p = round_up(n, br), round_up(v, bv)
    xp = pad_axis(pad_axis(x, 0, n_p), 1, v_p)
    lab = pad_axis(labels.reshape(n, 1), 0, n_p, -1)
    col = pl.BlockSpec((br, 1), lambda i: (i, 0))
    lp, lse = call(
        functools.partial(_tl_fwd_kernel, bv=bv, v=v, nv=v_p // bv), grid=(n_p // br,),
        in_specs=[pl.BlockSpec((br, v_p), lambda i: (i, 0)), col], out_specs=[col, col],
        out_shape=[jax.ShapeDtypeStruct((n_p, 1), acc)] * 2,
        target=lowering(cfg, interpret), name="token_logprobs_fwd", launch=_launch(cfg),
    )(xp, lab)
    return lp[:n, 0], lse[:n, 0]


@kernel_jit(static_argnames=("cfg", "interpret"))
def token_logprobs_bwd(x: jax.Array, labels: jax.Array, lse: jax.Array, g: jax.Array, *, cfg: VocabBlocks,
                       interpret: bool) -> jax.Array:
    """-> d x [N, V] in x.dtype."""
    n, v = x.shape
    br, bv = cfg.rows, cfg.vocab
    n_p, v_p = round_up(n, br), round_up(v, bv)
    xp = pad_axis(pad_axis(x, 0, n_p), 1, v_p)
    col = pl.BlockSpec((br, 1), lambda i, c: (i, 0))
    blk = pl.BlockSpec((br, bv), lambda i, c: (i, c))
    (dx,) = call(
        _tl_bwd_kernel, grid=(n_p // br, v_p // bv),
        in_specs=[blk, col, col, col], out_specs=[blk],
        out_shape=[jax.ShapeDtypeStruct((n_p, v_p), x.dtype)],
        target=lowering(cfg, interpret), name="token_logprobs_bwd", launch=_launch(cfg),
    )(xp, pad_axis(labels.reshape(n, 1), 0, n_p, -1), pad_axis(lse.reshape(n, 1), 0, n_p),
      pad_axis(g.reshape(n, 1).astype(lse.dtype), 0, n_p))
    return dx[:n, :v]


# ---------------------------------------------------------------- fused LM head

def _logits(h_ref, hrows, w_ref, wrows, shape, bh, nh, acc):
    """[rows, vocab] logits h[hrows] @ w[wrows]^T, summed over nh slices of bh features."""
    def body(k, s):
        ks = pl.ds(pl.multiple_of(k * bh, bh), bh)
        return s + dot_nt(h_ref[hrows, ks], w_ref[wrows, ks], acc)

    return lax.fori_loop(0, nh, body, jnp.zeros(shape, acc))


def _dlogits(s, lab, lse, g, cols, v):
    """g * (onehot(label) - softmax) for one tile; 0 on padded columns and ignored rows."""
    d = g * (jnp.where(cols == lab, 1.0, 0.0) - jnp.exp(s - lse))
    return jnp.where((cols < v) & (lab >= 0), d, 0.0)


def _ltl_fwd_kernel(h_ref, w_ref, lab_ref, m_ref, l_ref, picked_ref, *, cfg, v, nv, nh, per_split):
    """Program (i, s): rows block i over vocabulary tiles [s * per_split, ...): its
    running max, sum of exponentials and picked logit, merged across s afterwards."""
    acc = m_ref.dtype
    br, bv, bh = cfg.rows, cfg.vocab, cfg.hidden
    lab = lab_ref[...]
    cols0 = lax.broadcasted_iota(jnp.int32, (br, bv), 1)

    def body(c, carry):
        cols = c * bv + cols0
        s = _logits(h_ref, slice(None), w_ref, pl.ds(pl.multiple_of(c * bv, bv), bv), (br, bv), bh, nh, acc)
        return _lse_step(carry, jnp.where(cols < v, s, NEG), cols, lab)

    lo = pl.program_id(1) * per_split
    m, l, picked = lax.fori_loop(lo, jnp.minimum(lo + per_split, nv), body, _init(br, acc))
    m_ref[...], l_ref[...], picked_ref[...] = m, l, picked


def _ltl_bwd_atomic_kernel(h_ref, w_ref, lab_ref, lse_ref, g_ref, _dh0, _dw0, dh_ref, dw_ref, *, cfg, v, nh):
    """Program (i, j): rows block i x vocabulary block j; adds its share into d hidden
    rows i and d weight rows j (float32, zero-initialised through the aliased inputs)."""
    acc = dh_ref.dtype
    br, bv, bh = cfg.rows, cfg.vocab, cfg.hidden
    cols = pl.program_id(1) * bv + lax.broadcasted_iota(jnp.int32, (br, bv), 1)
    s = _logits(h_ref, slice(None), w_ref, slice(None), (br, bv), bh, nh, acc)
    d = _dlogits(s, lab_ref[...], lse_ref[...], g_ref[...], cols, v)

    def body(k, _):
        ks = pl.ds(pl.multiple_of(k * bh, bh), bh)
        w, h = w_ref[:, ks], h_ref[:, ks]
        plgpu.atomic_add(dh_ref, (slice(None), ks), dot_nn(d.astype(w.dtype), w, acc))
        plgpu.atomic_add(dw_ref, (slice(None), ks), dot_tn(d.astype(h.dtype), h, acc))
        return 0

    lax.fori_loop(0, nh, body, 0)


def _ltl_dh_kernel(h_ref, w_ref, lab_ref, lse_ref, g_ref, dh_ref, *, cfg, v, nv, nh):
    """Program i owns d hidden rows i: walks the vocabulary, recomputing logits."""
    acc = dh_ref.dtype
    br, bv, bh = cfg.rows, cfg.vocab, cfg.hidden
    lab, lse, g = lab_ref[...], lse_ref[...], g_ref[...]
    cols0 = lax.broadcasted_iota(jnp.int32, (br, bv), 1)
    dh_ref[...] = jnp.zeros(dh_ref.shape, acc)

    def body(c, _):
        vs = pl.ds(pl.multiple_of(c * bv, bv), bv)
        d = _dlogits(_logits(h_ref, slice(None), w_ref, vs, (br, bv), bh, nh, acc), lab, lse, g, c * bv + cols0, v)

        def add(k, _):
            ks = pl.ds(pl.multiple_of(k * bh, bh), bh)
            w = w_ref[vs, ks]
            dh_ref[:, ks] += dot_nn(d.astype(w.dtype), w, acc)
            return 0

        return lax.fori_loop(0, nh, add, 0)

    lax.fori_loop(0, nv, body, 0)


def _ltl_dw_kernel(h_ref, w_ref, lab_ref, lse_ref, g_ref, dw_ref, *, cfg, v, nr, nh):
    """Program j owns d weight rows j: walks the rows, recomputing logits."""
    acc = dw_ref.dtype
    br, bv, bh = cfg.rows, cfg.vocab, cfg.hidden
    cols = pl.program_id(0) * bv + lax.broadcasted_iota(jnp.int32, (br, bv), 1)
    dw_ref[...] = jnp.zeros(dw_ref.shape, acc)

    def body(r, _):
        rs = pl.ds(pl.multiple_of(r * br, br), br)
        s = _logits(h_ref, rs, w_ref, slice(None), (br, bv), bh, nh, acc)
        d = _dlogits(s, lab_ref[rs, :], lse_ref[rs, :], g_ref[rs, :], cols, v)

        def add(k, _):
            ks = pl.ds(pl.multiple_of(k * bh, bh), bh)
            h = h_ref[rs, ks]
            dw_ref[:, ks] += dot_tn(d.astype(h.dtype), h, acc)
            return 0

        return lax.fori_loop(0, nh, add, 0)

    lax.fori_loop(0, nr, body, 0)


def _ltl_geometry(h, w, cfg):
    n, hd = h.shape
    v = w.shape[0]
    return n, hd, v, round_up(n, cfg.rows), round_up(hd, cfg.hidden), round_up(v, cfg.vocab)


@kernel_jit(static_argnames=("cfg", "interpret"))
def linear_token_logprobs_fwd(h: jax.Array, w: jax.Array, labels: jax.Array, *, cfg: LinearLogprobsBlocks,
                              interpret: bool) -> tuple[jax.Array, jax.Array]:
    """h [N, H], w [V, H], labels [N] -> (logprobs [N], lse [N]) float32 (float64 for float64 h).

    Zero padding of H (to whole slices) changes no logit; padded vocabulary columns
    are masked; padded rows are dropped.
    """
    n, hd, v, n_p, h_p, v_p = _ltl_geometry(h, w, cfg)
    acc = acc_dtype(h.dtype)
    br, nv = cfg.rows, v_p // cfg.vocab
    per_split = -(-nv // max(1, cfg.vocab_splits))
    splits = -(-nv // per_split)
    part = pl.BlockSpec((br, 1), lambda i, s: (i, s))
    m, l, picked = call(
        functools.partial(_ltl_fwd_kernel, cfg=cfg, v=v, nv=nv, nh=h_p // cfg.hidden, per_split=per_split),
        grid=(n_p // br, splits),
        in_specs=[pl.BlockSpec((br, h_p), lambda i, s: (i, 0)), pl.BlockSpec((v_p, h_p), lambda i, s: (0, 0)),
                  pl.BlockSpec((br, 1), lambda i, s: (i, 0))],
        out_specs=[part] * 3, out_shape=[jax.ShapeDtypeStruct((n_p, splits), acc)] * 3,
        target=lowering(cfg, interpret), name="linear_token_logprobs_fwd", launch=_launch(cfg),
    )(pad_axis(pad_axis(h, 0, n_p), 1, h_p), pad_axis(pad_axis(w, 0, v_p), 1, h_p),
      pad_axis(labels.reshape(n, 1), 0, n_p, -1))
    # Merge the splits' partial log-sum-exps ([N, splits]: a few numbers a row).
    top = jnp.max(m, axis=1, keepdims=True)
    lse = (top + jnp.log(jnp.sum(l * jnp.exp(m - top), axis=1, keepdims=True)))[:n, 0]
    lp = jnp.where(labels >= 0, jnp.sum(picked, axis=1)[:n] - lse, 0.0)
    return lp, lse


@kernel_jit(static_argnames=("cfg", "interpret"))
def linear_token_logprobs_bwd(h: jax.Array, w: jax.Array, labels: jax.Array, lse: jax.Array, g: jax.Array, *,
                              cfg: LinearLogprobsBlocks, interpret: bool) -> tuple[jax.Array, jax.Array]:
    """-> (d h [N, H] in h.dtype, d w [V, H] in w.dtype), accumulated in float32."""
    n, hd, v, n_p, h_p, v_p = _ltl_geometry(h, w, cfg)
    acc = acc_dtype(h.dtype)
    br, bv = cfg.rows, cfg.vocab
    nh = h_p // cfg.hidden
    hp, wp = pad_axis(pad_axis(h, 0, n_p), 1, h_p), pad_axis(pad_axis(w, 0, v_p), 1, h_p)
    labp = pad_axis(labels.reshape(n, 1), 0, n_p, -1)
    lsep = pad_axis(lse.reshape(n, 1), 0, n_p)
    gp = pad_axis(g.reshape(n, 1).astype(lse.dtype), 0, n_p)
    dh_shape = jax.ShapeDtypeStruct((n_p, h_p), acc)
    dw_shape = jax.ShapeDtypeStruct((v_p, h_p), acc)

    if cfg.atomics:
        rows = pl.BlockSpec((br, h_p), lambda i, j: (i, 0))
        vocab = pl.BlockSpec((bv, h_p), lambda i, j: (j, 0))
        col = pl.BlockSpec((br, 1), lambda i, j: (i, 0))
        dh, dw = call(
            functools.partial(_ltl_bwd_atomic_kernel, cfg=cfg, v=v, nh=nh), grid=(n_p // br, v_p // bv),
            in_specs=[rows, vocab, col, col, col, rows, vocab], out_specs=[rows, vocab],
            out_shape=[dh_shape, dw_shape], input_output_aliases={5: 0, 6: 1},
            target=lowering(cfg, interpret), name="linear_token_logprobs_bwd", launch=_launch(cfg),
        )(hp, wp, labp, lsep, gp, jnp.zeros(dh_shape.shape, acc), jnp.zeros(dw_shape.shape, acc))
    else:
        col = pl.BlockSpec((br, 1), lambda i: (i, 0))
        rows = pl.BlockSpec((br, h_p), lambda i: (i, 0))
        (dh,) = call(
            functools.partial(_ltl_dh_kernel, cfg=cfg, v=v, nv=v_p // bv, nh=nh), grid=(n_p // br,),
            in_specs=[rows, pl.BlockSpec((v_p, h_p), lambda i: (0, 0)), col, col, col], out_specs=[rows],
            out_shape=[dh_shape], target=lowering(cfg, interpret), name="linear_token_logprobs_dh",
            launch=_launch(cfg),
        )(hp, wp, labp, lsep, gp)
        colfull = pl.BlockSpec((n_p, 1), lambda j: (0, 0))
        vocab = pl.BlockSpec((bv, h_p), lambda j: (j, 0))
        (dw,) = call(
            functools.partial(_ltl_dw_kernel, cfg=cfg, v=v, nr=n_p // br, nh=nh), grid=(v_p // bv,),
            in_specs=[pl.BlockSpec((n_p, h_p), lambda j: (0, 0)), vocab, colfull, colfull, colfull],
            out_specs=[vocab], out_shape=[dw_shape], target=lowering(cfg, interpret), name="linear_token_logprobs_dw",
            launch=_launch(cfg),
        )(hp, wp, labp, lsep, gp)
    return dh[:n, :hd].astype(h.dtype), dw[:v, :hd].astype(w.dtype)
