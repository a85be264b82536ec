"""Output kinds: what an output means decides how its artifact is judged.

Every output of a model has a kind (OUTPUT_KINDS, registered below where
each kind's judge is defined): class scores (`logits`), `probabilities`,
`regression`, `embedding`, `dense_map` (segmentation, depth) and
`token_logits` (an LM head), `multilabel`, or `unknown`. The user's word comes
first (`--output-kind NAME=KIND`, the model.pt manifest's `output_kinds`,
`output_kinds=` in the Python API); then what the eval labels say of the
output they score (`from_labels`: integer class indices -> class scores,
[N, H, W] integer classes of an [N, C, H, W] output -> a per-pixel class
map, 0/1 per column -> multi-label, real values of the output's size ->
regression); then the float graph (`decide`: a final SOFTMAX ->
probabilities; a final LOGISTIC over more than SMALL_SIGMOID values ->
probabilities per bin; a LOGISTIC over a few values (a box, a binary or
multi-label score) says nothing about classes: kind unknown). An output of
unknown kind is judged numerically (cosine, elementwise) and the report
says "kind unknown": never top-1 by default. Each kind's source names what
it was inferred from.

Each judge returns figures (added to parity.compare's numeric ones) and
`checks(figures, profile)` turns them into criteria with their bounds from
the target profile (convert/targets/*.toml).

Near-ties (class scores, probabilities, token logits): a top-1 flip is a
near-tie only when PyTorch's OWN top-2 gap is within float32 noise of the
reference (TIE_NOISE x the row's largest |score|), never measured against
the variant's error: a variant with a larger error would otherwise forgive
itself more flips (issue 19: an int8 pitch tracker shipped at top-1 0.11).
And a variant that flips more than the profile's max_flip_rate of its rows
fails whatever the margins.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np

from tpu_pipeline.errors import UserError
from tpu_pipeline.registry import Registry
from tpu_pipeline.stats import wilson

# float32 noise of a reference score, relative to the row's largest |score|: the desktop float32
# artifact is accepted within atol 1e-4 x the output's scale (convert/targets/desktop.toml), so two
# correct float32 kernels (PyTorch, XNNPACK) may order scores closer than this either way: a gap
# inside it is undecided even in float32, and a flip there is no precision loss.
TIE_NOISE = 1e-4
# Error bounds apply to the mean over rows of each row's largest error, not to the single worst element
# nor to a tail quantile: a systematic error (a clipped int8 range: every row) moves it, while the
# heavy tail of int8 rounding (a few rows of 64 losing much of one probability, their top-1 intact)
# made a 95th percentile flip between redraws of the same model (0.03-0.14 over 5 seeds for the
# pitch tracker in tests/support/trained_models.py); rows that change their answer are what top-1
# and the flip rate count. The worst row is still reported.


@dataclasses.dataclass(frozen=True)
class OutputKind:
    """A kind's judge: `figures(r, g)` (reference and artifact, rows stacked on axis 0, float64)
    -> figures; `checks(figures, profile)` -> [(criterion, value, bound, passed, reason-if-failed)]."""

    figures: Callable[[np.ndarray, np.ndarray], dict]
    checks: Callable[[dict, object], list[tuple]]
    task_criteria: bool = True  # False: judged by parity's numeric criteria only (cosine, elementwise)


OUTPUT_KINDS: Registry[OutputKind] = Registry(
    "output kind", "one @OUTPUT_KINDS.register on the kind's judge in convert/verdict/output_kinds.py, its bounds in the "
                   "target profiles")


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _top1(r: np.ndarray, g: np.ndarray) -> dict:
    """Top-1 over the last axis. A flip is a near-tie only when PyTorch's own top-1 and top-2
    scores lie within TIE_NOISE x the row's scale (float32 noise); every other flip is clear."""
    rows_r, rows_g = r.reshape(-1, r.shape[-1]), g.reshape(-1, g.shape[-1])
    ar, ag = rows_r.argmax(1), rows_g.argmax(1)
    flips = np.flatnonzero(ar != ag)
    top2 = np.sort(rows_r, axis=1)[:, -2:]
    gap = top2[:, 1] - top2[:, 0]
    noise = TIE_NOISE * np.abs(rows_r).max(1)
    near = gap[flips] <= noise[flips]
    n, k = len(rows_r), len(rows_r) - len(flips)
    clear = int((~near).sum())
    return {"top1": k / n, "top1_interval": wilson(k, n), "top1_judged": 1 - clear / n,
            "top1_judged_interval": wilson(n - clear, n), "top1_rows": int(n), "flip_rate": len(flips) / n,
            "top1_near_ties": int(near.sum()), "top1_clear_flips": clear,
            "top1_tie_noise": float(noise.max(initial=0.0)),
            "top1_flip_margins": [float(m) for m in (rows_r[flips, ar[flips]] - rows_r[flips, ag[flips]])[:16]]}


def _top1_checks(m: dict, prof) -> list[tuple]:
    rows = [("top1", m["top1_judged"], prof.min_top1, m["top1_judged"] >= prof.min_top1,
             f"top-1 agreement {m['top1_judged']:.3f} (95% CI {m['top1_judged_interval'][0]:.3f}-"
             f"{m['top1_judged_interval'][1]:.3f}) < {prof.min_top1} ({m['top1_clear_flips']} clear flips of "
             f"{m['top1_rows']} rows)"),
            ("flip_rate", m["flip_rate"], prof.max_flip_rate, m["flip_rate"] <= prof.max_flip_rate,
             f"top-1 flipped on {m['flip_rate']:.1%} of {m['top1_rows']} rows (near-ties included; bound "
             f"{prof.max_flip_rate:.1%}): more than float32 noise explains, whatever the margins")]
    return rows


def _row_mean(err: np.ndarray) -> float:
    """The mean over rows of each row's largest value."""
    per_row = err.reshape(len(err), -1).max(1, initial=0.0)
    return float(per_row.mean()) if len(per_row) else 0.0


def _prob_figures(pr: np.ndarray, pg: np.ndarray) -> dict:
    d = np.abs(pg - pr)
    rows_r, rows_d = pr.reshape(-1, pr.shape[-1]), d.reshape(-1, d.shape[-1])
    conf = rows_d[np.arange(len(rows_r)), rows_r.argmax(1)]  # the error of the probability PyTorch ranks first
    return {"prob_error": _row_mean(d), "prob_max_abs": float(d.max(initial=0.0)),
            "prob_mean_abs": float(d.mean()) if d.size else 0.0, "confidence_error_mean": float(conf.mean())}


def _prob_checks(m: dict, prof) -> list[tuple]:
    rows = _top1_checks(m, prof) if "top1" in m else []
    rows.append(("probability_error", m["prob_error"], prof.max_prob_error, m["prob_error"] <= prof.max_prob_error,
                 f"probabilities off by {m['prob_error']:.3g} (each row's largest error, mean over rows; worst "
                 f"{m['prob_max_abs']:.3g}, mean {m['prob_mean_abs']:.3g}; bound {prof.max_prob_error})"))
    return rows


@OUTPUT_KINDS.register("logits")
def _logits() -> OutputKind:
    """class scores (logits): top-1 agreement, flip rate, error on the probability scale (softmax)"""
    def figures(r, g):
        out = _top1(r, g) if r.ndim >= 2 and r.shape[-1] > 1 else {}
        pr, pg = (_softmax(r), _softmax(g)) if r.shape[-1] > 1 else (1 / (1 + np.exp(-r)), 1 / (1 + np.exp(-g)))
        return {**out, **_prob_figures(pr, pg)}
    return OutputKind(figures, _prob_checks)


@OUTPUT_KINDS.register("token_logits")
def _token_logits() -> OutputKind:
    """an LM head's next-token scores: top-1 agreement per position and error on the probability scale"""
    return _logits()


@OUTPUT_KINDS.register("probabilities")
def _probabilities() -> OutputKind:
    """probabilities (a final softmax or sigmoid): top-1 agreement where there are classes, absolute error"""
    def figures(r, g):
        out = _top1(r, g) if r.ndim >= 2 and r.shape[-1] > 1 else {}
        return {**out, **_prob_figures(r, g)}
    return OutputKind(figures, _prob_checks)


@OUTPUT_KINDS.register("regression")
def _regression() -> OutputKind:
    """regression values (boxes, pitch, landmarks): error relative to the reference's spread over the rows"""
    def figures(r, g):
        rf, gf = r.reshape(len(r), -1), g.reshape(len(g), -1)
        # each element's spread over the eval rows; a constant element falls back to the output's scale
        std = rf.std(0)
        floor = max(float(np.abs(rf).mean()), np.finfo(np.float64).tiny) if rf.size else 1.0
        std = np.where(std > 1e-12 * floor, std, floor)
        rel = np.abs(gf - rf) / std
        return {"rel_err": _row_mean(rel), "rel_err_max": float(rel.max(initial=0.0)),
                "rel_err_mean": float(rel.mean()) if rel.size else 0.0,
                "reference_spread": float(std.mean()) if std.size else 0.0}

    def checks(m, prof):
        return [("regression_error", m["rel_err"], prof.max_regression_error, m["rel_err"] <= prof.max_regression_error,
                 f"error {m['rel_err']:.3g} x the reference's spread over the eval rows (each row's largest, mean over rows; "
                 f"worst {m['rel_err_max']:.3g}; bound {prof.max_regression_error})"),
                ("regression_error_mean", m["rel_err_mean"], prof.max_regression_mean_error,
                 m["rel_err_mean"] <= prof.max_regression_mean_error,
                 f"mean error {m['rel_err_mean']:.3g} x the reference's spread (bound {prof.max_regression_mean_error})")]
    return OutputKind(figures, checks)


@OUTPUT_KINDS.register("embedding")
def _embedding() -> OutputKind:
    """embeddings: mean cosine and nearest-neighbour agreement over the eval set"""
    def figures(r, g):
        rf, gf = r.reshape(len(r), -1), g.reshape(len(g), -1)

        def unit(x):
            n = np.sqrt((x * x).sum(1, keepdims=True))
            return x / np.where(n > 0, n, 1.0)
        ur, ug = unit(rf), unit(gf)
        cos = (ur * ug).sum(1)
        out = {"embedding_cosine_mean": float(cos.mean()), "embedding_cosine_min": float(cos.min())}
        if len(rf) >= 3:
            # each row's nearest other row, in PyTorch's space and in the artifact's
            sr, sg = ur @ ur.T, ug @ ug.T
            np.fill_diagonal(sr, -np.inf)
            np.fill_diagonal(sg, -np.inf)
            k = int((sr.argmax(1) == sg.argmax(1)).sum())
            out.update({"nn_agreement": k / len(rf), "nn_agreement_interval": wilson(k, len(rf))})
        return out

    def checks(m, prof):
        rows = [("embedding_cosine", m["embedding_cosine_mean"], prof.min_cosine,
                 m["embedding_cosine_mean"] >= prof.min_cosine,
                 f"mean cosine {m['embedding_cosine_mean']:.4f} < {prof.min_cosine}")]
        if "nn_agreement" in m:
            rows.append(("nn_agreement", m["nn_agreement"], prof.min_nn_agreement,
                         m["nn_agreement"] >= prof.min_nn_agreement,
                         f"nearest-neighbour agreement {m['nn_agreement']:.3f} < {prof.min_nn_agreement}"))
        return rows
    return OutputKind(figures, checks)


@OUTPUT_KINDS.register("dense_map")
def _dense_map() -> OutputKind:
    """dense maps (segmentation, depth; N x C x H x W): per-pixel argmax agreement over C, else PSNR"""
    def figures(r, g):
        out = {}
        if r.ndim >= 4 and r.shape[-3] > 1:
            # PyTorch's layout: channels on axis -3 (LiteRT outputs are compared in PyTorch's layout)
            cr, cg = r.argmax(-3), g.argmax(-3)
            agree = cr == cg
            out.update({"pixel_agreement": float(agree.mean()), "pixels": int(agree.size),
                        "miou_vs_torch": mean_iou(cg, cr, r.shape[-3])})
        span = float(r.max() - r.min()) if r.size else 0.0
        mse = float(((g - r) ** 2).mean()) if r.size else 0.0
        out["psnr_db"] = float(10 * math.log10(span * span / mse)) if mse > 0 and span > 0 else float("inf")
        return out

    def checks(m, prof):
        if "pixel_agreement" in m:
            return [("pixel_agreement", m["pixel_agreement"], prof.min_pixel_agreement,
                     m["pixel_agreement"] >= prof.min_pixel_agreement,
                     f"per-pixel argmax agreement {m['pixel_agreement']:.4f} < {prof.min_pixel_agreement}")]
        return [("psnr_db", m["psnr_db"], prof.min_psnr_db, m["psnr_db"] >= prof.min_psnr_db,
                 f"PSNR {m['psnr_db']:.1f} dB < {prof.min_psnr_db} dB")]
    return OutputKind(figures, checks)


def mean_iou(pred: np.ndarray, truth: np.ndarray, classes: int) -> float:
    """Mean over the classes present in either map of |pred == c and truth == c| / |pred == c or
    truth == c| (the segmentation score); 1.0 when both maps are empty."""
    p, t = np.asarray(pred).reshape(-1), np.asarray(truth).reshape(-1)
    both = np.bincount(t[p == t], minlength=classes)[:classes]
    union = np.bincount(p, minlength=classes)[:classes] + np.bincount(t, minlength=classes)[:classes] - both
    present = union > 0
    return float((both[present] / union[present]).mean()) if present.any() else 1.0


def decisions(x: np.ndarray) -> np.ndarray:
    """Multi-label decisions: p >= 0.5 for probabilities (every value in [0, 1], a final sigmoid),
    else logit >= 0 (the same threshold before the sigmoid)."""
    x = np.asarray(x, np.float64)
    return x >= (0.5 if x.size and x.min() >= 0.0 and x.max() <= 1.0 else 0.0)


@OUTPUT_KINDS.register("multilabel")
def _multilabel() -> OutputKind:
    """multi-label scores (0/1 labels per column; sigmoid or its logits): per-label decision agreement, no top-1"""
    def figures(r, g):
        dr = decisions(r)
        # the artifact's outputs are read on PyTorch's scale (both probabilities or both logits)
        dg = np.asarray(g, np.float64) >= (0.5 if dr.size and r.min() >= 0.0 and r.max() <= 1.0 else 0.0)
        rows = (dr == dg).reshape(len(r), -1).all(1)
        k = int(rows.sum())
        return {"label_agreement": float((dr == dg).mean()) if dr.size else 1.0, "rows_all_labels_agree": k / len(r),
                "rows_all_labels_agree_interval": wilson(k, len(r))}

    def checks(m, prof):
        # a changed decision is a changed answer, as a top-1 flip is: the same bound on its rate
        changed = 1.0 - m["label_agreement"]
        return [("label_flip_rate", changed, prof.max_flip_rate, changed <= prof.max_flip_rate,
                 f"{changed:.1%} of the multi-label decisions changed (bound {prof.max_flip_rate:.1%})")]
    return OutputKind(figures, checks)


@OUTPUT_KINDS.register("unknown")
def _unknown() -> OutputKind:
    """kind unknown (neither inferred nor given): judged numerically (cosine, elementwise), never top-1"""
    return OutputKind(lambda r, g: {}, lambda m, prof: [], task_criteria=False)


def get(name: str) -> OutputKind:
    """The judge of kind `name` (an unknown name lists the valid ones)."""
    return OUTPUT_KINDS.get(name)()


def names() -> list[str]:
    return OUTPUT_KINDS.names()


# ops whose output is a probability; ops that only move values are looked through
PROBABILITY_OPS = {"SOFTMAX", "LOGISTIC"}
PASS_THROUGH_OPS = {"RESHAPE", "SQUEEZE", "EXPAND_DIMS", "DEQUANTIZE", "QUANTIZE", "TRANSPOSE"}
# A sigmoid over at most this many values is a box, a binary or a multi-label score as often as a
# class probability (issue 30: a [N, 4] box head ending in a sigmoid was judged by top-1): without
# labels or the user's word it is no class output. Over more values (a pitch tracker's bins, tags)
# it is probabilities per bin, judged by their error and top-1.
SMALL_SIGMOID = 8
UNKNOWN = ("unknown", "neither inferred nor given")


def final_activation(info, tensor_index: int) -> str | None:
    """The op that produces the output tensor `tensor_index` of the float .tflite (tflite_info.
    ModelInfo), looking through reshapes: "SOFTMAX", "LOGISTIC", or None (anything else)."""
    producer = {i: op for op in info.ops for i in op["outputs"]}
    idx, seen = tensor_index, set()
    while idx in producer and idx not in seen:
        seen.add(idx)
        op = producer[idx]
        if op["op"] in PROBABILITY_OPS:
            return op["op"]
        if op["op"] not in PASS_THROUGH_OPS or not op["inputs"]:
            return None
        idx = op["inputs"][0]
    return None


def infer(info, tensor_index: int) -> str | None:
    """The kind the float graph alone states for output `tensor_index`: "probabilities" for a final
    SOFTMAX or LOGISTIC, else None. Callers with the output's width use `decide`, which does not
    take a sigmoid over a few values for class probabilities."""
    return "probabilities" if final_activation(info, tensor_index) else None


def _integral(y: np.ndarray) -> bool:
    return y.dtype.kind in "biu" or (y.dtype.kind == "f" and bool(np.all(y == np.round(y))))


def from_labels(out: np.ndarray, labels: np.ndarray) -> tuple[str, str] | None:
    """What the eval labels say of the output they score: out is PyTorch's output stacked over the
    eval rows (N, ...), labels the eval data's (N, ...). (kind, why) or None when they say nothing
    (a --metric's own labels)."""
    y, n = np.asarray(labels), len(labels)
    if out.ndim == 0 or len(out) != n or n == 0:
        return None
    width = out.shape[-1] if out.ndim >= 2 else 0
    integral = _integral(y)
    per_row = y.reshape(n, -1).shape[1]
    if out.ndim == 4 and out.shape[1] > 1 and y.shape == (n, *out.shape[2:]) and integral \
            and bool(np.all((y >= 0) & (y < out.shape[1]))):
        return "dense_map", (f"the eval labels: integer classes in [0, {out.shape[1]}) per pixel "
                             f"{list(y.shape)} for its [N, C, H, W] output: a per-pixel class map")
    if out.ndim == 2 and width > 1 and per_row == 1 and integral and bool(np.all((y >= 0) & (y < width))):
        return "logits", f"the eval labels: integer class indices in [0, {width}) for its {width} columns"
    binary = integral and bool(np.all((y == 0) | (y == 1)))
    if out.ndim == 2 and binary and per_row == width:
        return "multilabel", f"the eval labels: 0/1 for each of its {width} columns (multi-label)"
    if per_row == out.reshape(n, -1).shape[1] and not binary:
        return "regression", (f"the eval labels: {'integer' if integral else 'real'} values of its size per row "
                              f"({list(out.shape[1:])}), not class indices: regression")
    return None


def decide(current: tuple[str, str], activation: str | None, width: int,
           out: np.ndarray | None = None, labels: np.ndarray | None = None) -> tuple[str, str]:
    """An output's (kind, source) once the float graph is known. current: the kind before the graph
    (the user's word, whose source is "given", or the manifest's task); activation: final_activation;
    width: the output's last dimension; out/labels: PyTorch's output over the eval rows and the
    labels that score it (None without labels)."""
    if current[1] == "given":
        return current
    said = from_labels(out, labels) if out is not None and labels is not None else None
    if said is not None:
        kind, why = said
        if kind == "logits" and activation == "SOFTMAX":
            return "probabilities", f"inferred from {why}; the float graph ends in a softmax"
        if kind == "logits" and activation == "LOGISTIC":
            return "probabilities", f"inferred from {why}; the float graph ends in a sigmoid"
        return kind, f"inferred from {why}"
    if activation == "SOFTMAX":
        return "probabilities", "inferred from the float graph: it ends in a softmax"
    if current[0] != "unknown":
        return current
    if activation == "LOGISTIC" and width > SMALL_SIGMOID:
        return "probabilities", f"inferred from the float graph: it ends in a sigmoid over {width} values (per bin)"
    if activation == "LOGISTIC":
        return "unknown", (f"kind unknown: the float graph ends in a sigmoid over {width} value(s), which may be a "
                           "box, a binary or multi-label score as well as a class probability; labels or "
                           "--output-kind tell which")
    return current


def parse(specs) -> dict[str, str]:
    """`NAME=KIND` strings (the CLI's repeated --output-kind) or a dict -> {name: kind}, each
    kind checked against OUTPUT_KINDS (UserError listing the valid ones)."""
    if isinstance(specs, dict):
        pairs = list(specs.items())
    else:
        pairs = []
        for s in specs or ():
            name, sep, kind = str(s).partition("=")
            if not sep or not name.strip() or not kind.strip():
                raise UserError(f"--output-kind {s!r}: expected NAME=KIND (KIND one of {', '.join(names())})")
            pairs.append((name.strip(), kind.strip()))
    for name, kind in pairs:
        if kind not in OUTPUT_KINDS:
            raise UserError(f"output kind {kind!r} for {name!r} is not one of {', '.join(names())}")
    return dict(pairs)
