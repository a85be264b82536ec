"""Task accuracy with labels: PyTorch's and each artifact's task score over the whole eval set,
with a 95% interval, and the drop each target profile bounds (`max_task_drop`).

The metric is `metric(outputs, labels) -> float`, higher is better unless the function has an
attribute `higher_is_better = False`: outputs is the model's one output stacked over the eval rows,
(N, ...), or a list of them for a model with several outputs; labels are the eval data's
`labels` (convert/verdict/eval_data.py), (N, ...). A user's metric is named `module:function` (--metric,
as rl names a reward) or passed as a function (metric= in the Python API). Without one, a
built-in metric scores the first output, chosen by its kind (convert/verdict/output_kinds.py):

- class scores and probabilities, with integer labels (N,) in [0, C): accuracy (argmax over the
  last axis), Wilson interval;
- regression, with labels of the output's size per row: R^2 (1 - squared error / the labels'
  variance around each column's mean): a drop is comparable across models, unlike an error in
  the output's own units;
- multi-label scores, with 0/1 labels of the output's shape: the share of decisions (p >= 0.5,
  or logit >= 0) equal to the labels;
- a per-pixel class map [N, C, H, W] with integer labels [N, H, W]: mean IoU over the classes
  (pixel accuracy is reported beside it by the dense_map kind's pixel agreement);
- kind unknown: accuracy when the labels are class indices of an [N, C] output, R^2 when they
  have the output's size (the report says which was chosen and why).

Intervals: Wilson for accuracy; otherwise a percentile bootstrap over rows (BOOTSTRAP resamples
drawn with --seed). The drop (PyTorch's score minus the artifact's, in the metric's units, so
0.01 = one point of accuracy) gets a paired bootstrap interval: the same resampled rows for both.
The verdict bounds the drop itself; its interval is reported.

The bound is in the metric's own units (0.5 for "half a dB" of a denoiser's SNR), taken from, in
order: --max-task-drop (`max_task_drop=` in Python: one number, or per target
"android=0.5,iot=1.0" where a bare number is every other target's), the user metric's own
`max_drop` attribute (with `unit`, e.g. fn.unit = "dB"; fn.max_drop = 0.5), else each target
profile's max_task_drop (written for accuracy-like scores in [0, 1]). The report records the
bound, where it came from and the unit.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np

from tpu_pipeline.convert.tool_output import first_line
from tpu_pipeline.convert.verdict import output_kinds
from tpu_pipeline.errors import UserError
from tpu_pipeline.stats import wilson
from tpu_pipeline.user_code import load_function

BOOTSTRAP = 200      # resamples for the intervals of metrics without a closed form, and of every drop
LEVEL = 0.95         # two-sided
CLASS_KINDS = ("logits", "probabilities")


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str                          # accuracy | r2 | module:function | the function's name
    fn: Callable[[object, np.ndarray], float]
    higher_is_better: bool = True
    wilson: bool = False               # a proportion of rows (accuracy): Wilson interval
    output: int | None = None          # built-in: the output it scores; None: every output goes to fn
    why: str = ""                      # how it was chosen
    unit: str = ""                     # the score's unit as the report prints it ("dB", "share of rows")
    max_drop: float | None = None      # the metric's own bound on the drop (a user metric's fn.max_drop)


def accuracy(outputs: np.ndarray, labels: np.ndarray) -> float:
    """Share of rows whose argmax over the last axis is the label."""
    o = np.asarray(outputs)
    pred = o.reshape(len(o), -1, o.shape[-1]).argmax(-1).reshape(len(o), -1)
    return float((pred == np.asarray(labels).reshape(len(o), -1)).mean())


def r2(outputs: np.ndarray, labels: np.ndarray) -> float:
    """Coefficient of determination over every column, pooled: 1 - SSE / SST (column means)."""
    o = np.asarray(outputs, np.float64).reshape(len(outputs), -1)
    y = np.asarray(labels, np.float64).reshape(len(labels), -1)
    sst = ((y - y.mean(0)) ** 2).sum()
    return float(1 - ((y - o) ** 2).sum() / sst) if sst > 0 else float("nan")


def label_accuracy(outputs: np.ndarray, labels: np.ndarray) -> float:
    """Multi-label: share of (row, label) decisions equal to the 0/1 labels."""
    return float((output_kinds.decisions(outputs) == (np.asarray(labels) > 0.5)).mean())


def miou(outputs: np.ndarray, labels: np.ndarray) -> float:
    """Segmentation [N, C, H, W] against [N, H, W] classes: mean IoU over the classes present."""
    o = np.asarray(outputs)
    return output_kinds.mean_iou(o.argmax(1), np.asarray(labels).astype(np.int64), o.shape[1])


def _chunks(tags: list[str]) -> set[tuple[int, int, str]]:
    """IOB2 entity chunks (start, end, type), conlleval's rules as seqeval's default mode: a chunk
    starts at B-X, or at I-X after O or another type; it ends before O, B-* or another type."""
    out, start, typ = set(), None, None
    for i, t in enumerate([*tags, "O"]):
        prefix, _, ty = t.partition("-") if "-" in t else (("O", "", "") if t == "O" else ("I", "", t))
        if start is not None and (prefix != "I" or ty != typ):
            out.add((start, i, typ))
            start = None
        if prefix in ("B", "I") and start is None:
            start, typ = i, ty
    return out


def entity_f1(names: tuple[str, ...], ignore: int = -100) -> Metric:
    """Token classification: micro F1 over entity chunks (_chunks) of each row's scored positions
    (labels != ignore), tag names `names` (id2label). seqeval's default mode computes the same; it
    is not a dependency (its last release is from 2020)."""

    def f1(outputs: np.ndarray, labels: np.ndarray) -> float:
        pred = np.asarray(outputs).argmax(-1)
        tp = n_pred = n_gold = 0
        for p, y in zip(pred, np.asarray(labels)):
            keep = y != ignore
            gold, got = _chunks([names[k] for k in y[keep]]), _chunks([names[k] for k in p[keep]])
            tp, n_pred, n_gold = tp + len(gold & got), n_pred + len(got), n_gold + len(gold)
        return 2 * tp / (n_pred + n_gold) if n_pred + n_gold else 1.0

    return Metric("entity_f1", f1, output=0, unit="F1", why="entity F1 (IOB2 chunks, seqeval's default mode) over "
                                                            "each word's first sub-token")


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one x0,y0,x1,y1 box with each row of `boxes`."""
    w = np.clip(np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0]), 0, None)
    h = np.clip(np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1]), 0, None)
    inter = w * h
    area = (box[2] - box[0]) * (box[3] - box[1]) + (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return inter / np.maximum(area - inter, 1e-12)


def map50(classes: int, iou: float = 0.5) -> Metric:
    """Object detection, DETR-style: outputs [logits (N, Q, classes + 1; the last: no object),
    boxes (N, Q, 4) cx,cy,w,h in 0..1]; labels: per image an array of (class, x0, y0, x1, y1) rows
    in 0..1. Mean over the classes present of the average precision at IoU 0.5, COCO's way:
    every query a detection scored by its best class probability, greedy matching by score, the
    precision envelope read at 101 recall points (as pycocotools; not a dependency: it builds C)."""

    def score(outputs, labels) -> float:
        logits, boxes = np.asarray(outputs[0], np.float64), np.asarray(outputs[1], np.float64)
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p = (p / p.sum(-1, keepdims=True))[..., :-1]
        cls, conf = p.argmax(-1), p.max(-1)
        xyxy = np.concatenate([boxes[..., :2] - boxes[..., 2:] / 2, boxes[..., :2] + boxes[..., 2:] / 2], -1)
        aps = []
        for c in range(classes):
            gts = [np.asarray(g).reshape(-1, 5) for g in labels]
            n_gt = sum(int((g[:, 0] == c).sum()) for g in gts)
            if n_gt == 0:
                continue
            dets = sorted(((conf[i, q], i, q) for i in range(len(gts)) for q in np.flatnonzero(cls[i] == c)),
                          key=lambda d: -d[0])
            used = [np.zeros(int((g[:, 0] == c).sum()), bool) for g in gts]
            tp = []
            for _, i, q in dets:
                g = gts[i][gts[i][:, 0] == c, 1:]
                ious = _iou(xyxy[i, q], g) if len(g) else np.zeros(0)
                ious[used[i]] = -1
                hit = len(ious) and ious.max() >= iou
                if hit:
                    used[i][ious.argmax()] = True
                tp.append(bool(hit))
            tps = np.cumsum(tp)
            recall = tps / n_gt if tp else np.zeros(0)
            precision = tps / np.arange(1, len(tp) + 1) if tp else np.zeros(0)
            envelope = np.maximum.accumulate(precision[::-1])[::-1] if tp else np.zeros(0)
            points = np.linspace(0, 1, 101)
            k = np.searchsorted(recall, points, side="left")
            aps.append(float(np.mean([envelope[j] if j < len(envelope) else 0.0 for j in k])))
        return float(np.mean(aps)) if aps else 0.0

    return Metric("map50", score, output=None, unit="AP", why="mAP@0.5 (COCO's 101-point interpolation) over the "
                                                             "logits and pred_boxes outputs")


def choose(spec, labels: np.ndarray, ref0: np.ndarray, kind: str, name: str, n_outputs: int) -> Metric:
    """The metric: the user's (`module:function` or a function), else the built-in for the first
    output's kind (ref0: that output stacked over the eval rows); UserError when none applies. A
    Metric is taken as it is (a Hugging Face folder's task decides its own: entity_f1)."""
    if isinstance(spec, Metric):
        return spec
    if spec is not None:
        fn = load_function(spec, "--metric") if isinstance(spec, str) else spec
        if not callable(fn):
            raise UserError(f"metric= takes a function or 'module:function', not {type(spec).__name__}")
        label = spec if isinstance(spec, str) else getattr(fn, "__qualname__", repr(fn))
        bound = getattr(fn, "max_drop", None)
        if bound is not None:
            bound = _bound(bound, f"--metric {label}: its max_drop")
        return Metric(label, fn, bool(getattr(fn, "higher_is_better", True)), why="given",
                      unit=str(getattr(fn, "unit", "") or ""), max_drop=bound)
    y = np.asarray(labels)
    integral = y.dtype.kind in "biu" or (y.dtype.kind == "f" and bool(np.all(y == np.round(y))))
    classes = ref0.shape[-1] if ref0.ndim >= 2 else 0
    is_index = (integral and y.reshape(len(y), -1).shape[1] == 1 and classes > 1
                and bool(np.all((y >= 0) & (y < classes))))
    same_size = y.reshape(len(y), -1).shape[1] == ref0.reshape(len(ref0), -1).shape[1]
    of = f" of output {name}" + (" (the first of the model's outputs)" if n_outputs > 1 else "")
    if kind in CLASS_KINDS:
        if not is_index:
            raise UserError(f"--eval-data labels: output {name} is {kind} over {classes} classes, so the built-in "
                            f"metric (accuracy) takes integer class indices in [0, {classes}), one per row; these "
                            f"are {y.dtype} of shape {list(y.shape)} (give --metric module:function for others)")
        return Metric("accuracy", accuracy, wilson=True, output=0, why=f"accuracy{of}: its kind is {kind}",
                      unit="share of rows")
    if kind == "multilabel" and y.shape == ref0.shape:
        return Metric("label_accuracy", label_accuracy, output=0, unit="share of decisions",
                      why=f"per-label accuracy{of}: its kind is multilabel (0/1 labels per column)")
    if kind == "dense_map" and ref0.ndim == 4 and y.shape == (len(y), *ref0.shape[2:]) and integral:
        return Metric("miou", miou, output=0, unit="IoU",
                      why=f"mean IoU{of}: a per-pixel class map with [N, H, W] labels")
    if kind == "regression":
        if not same_size:
            raise UserError(f"--eval-data labels: output {name} is a regression of {ref0.shape[1:]} per row; the "
                            f"built-in metric (R^2) takes labels of that size per row, not {list(y.shape[1:])}")
        return Metric("r2", r2, output=0, unit="R^2", why=f"R^2{of}: its kind is regression")
    if kind == "unknown":
        if is_index and ref0.ndim == 2:
            return Metric("accuracy", accuracy, wilson=True, output=0, unit="share of rows",
                          why=f"accuracy{of}: kind unknown, and the labels are class indices of its {classes} "
                              "columns (give --output-kind or --metric otherwise)")
        if same_size:
            return Metric("r2", r2, output=0, unit="R^2", why=f"R^2{of}: kind unknown, and the labels have its size per row "
                                                  "(give --output-kind or --metric otherwise)")
    raise UserError(f"--eval-data labels: no built-in metric for output {name} ({kind}) with labels of shape "
                    f"{list(y.shape)}; give --metric module:function (metric(outputs, labels) -> float)")


def _bound(value, where: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{where}: {value!r} is not a number") from None
    if not math.isfinite(v) or v < 0:
        raise UserError(f"{where}: {value!r}; a drop bound is a finite number >= 0, in the metric's units")
    return v


ALL_TARGETS = "*"  # parse_max_drop's key for a bare number: every target not named


def parse_max_drop(spec, targets: list[str]) -> dict[str, float]:
    """--max-task-drop / max_task_drop= -> {target or ALL_TARGETS: bound}: a number (every target),
    "android=0.5,iot=1.0" (a bare item: every other target's) or a dict; UserError for a bad
    number or a target not among `targets` (the requested ones). None -> {}."""
    if spec is None or spec == "":
        return {}
    if isinstance(spec, dict):
        items = [(str(k), v) for k, v in spec.items()]
    elif isinstance(spec, (int, float)) and not isinstance(spec, bool):
        items = [(ALL_TARGETS, spec)]
    else:
        items = []
        for part in str(spec).split(","):
            name, sep, value = part.strip().rpartition("=")
            if not part.strip() or (sep and not name.strip()):
                raise UserError(f"--max-task-drop {spec!r}: expected a number or TARGET=NUMBER items, comma-separated")
            items.append((name.strip() if sep else ALL_TARGETS, value))
    out: dict[str, float] = {}
    for name, value in items:
        if name != ALL_TARGETS and name not in targets:
            raise UserError(f"--max-task-drop: {name!r} is not a requested target ({', '.join(targets)})")
        if name in out:
            raise UserError(f"--max-task-drop: {name if name != ALL_TARGETS else 'a bare number'} is given twice")
        out[name] = _bound(value, f"--max-task-drop {name + '=' if name != ALL_TARGETS else ''}{value}")
    return out


def max_drop_for(target: str, profile_bound: float, given: dict[str, float], metric: Metric) -> tuple[float, str]:
    """The drop bound for `target` and where it came from (report.json's task max_drop_from)."""
    if target in given:
        return given[target], f"--max-task-drop {target}={given[target]:g}"
    if ALL_TARGETS in given:
        return given[ALL_TARGETS], f"--max-task-drop {given[ALL_TARGETS]:g}"
    if metric.max_drop is not None:
        return metric.max_drop, f"the metric {metric.name}'s max_drop"
    return profile_bound, f"the {target} profile"


class TaskScore:
    """The metric and labels of one conversion, and PyTorch's score; `judge` scores an artifact."""

    def __init__(self, metric: Metric, labels: np.ndarray, torch_outputs: list[np.ndarray], seed: int):
        if labels.dtype.kind == "f" and not np.isfinite(labels).all():
            raise UserError("--eval-data labels hold NaN or inf")
        self.metric, self.labels = metric, labels
        n = len(labels)
        if any(len(o) != n for o in torch_outputs):
            raise UserError(f"--eval-data: {n} labels for {len(torch_outputs[0])} rows")
        rng = np.random.default_rng([seed, 19])  # its own stream: drawing them moves no other draw
        self.resamples = rng.integers(0, n, (BOOTSTRAP, n))
        try:
            self.torch_score = self._score(torch_outputs)
            self._torch_boot = np.array([self._score(torch_outputs, i) for i in self.resamples])
        except _MetricFailed as e:
            raise UserError(f"--metric {metric.name} on PyTorch's outputs: {e}") from None
        self.torch_interval = self._interval(self.torch_score, self._torch_boot)

    def _score(self, outputs: list[np.ndarray], rows: np.ndarray | None = None) -> float:
        outs = outputs if rows is None else [o[rows] for o in outputs]
        y = self.labels if rows is None else self.labels[rows]
        arg = outs[self.metric.output] if self.metric.output is not None else (outs[0] if len(outs) == 1 else outs)
        try:
            v = self.metric.fn(arg, y)
        except Exception as e:  # noqa: BLE001 - the user's code: its failure is reported, never a crash
            raise _MetricFailed(f"raised {type(e).__name__}: {first_line(e)}") from None
        try:
            v = float(v)
        except (TypeError, ValueError):
            raise _MetricFailed(f"returned {type(v).__name__}, not a number") from None
        if not math.isfinite(v):
            raise _MetricFailed(f"returned {v}")
        return v

    def _interval(self, score: float, boot: np.ndarray) -> list[float]:
        if self.metric.wilson:
            n = len(self.labels)
            return wilson(round(score * n), n)
        return _percentiles(boot)

    def judge(self, outputs: list[np.ndarray], max_drop: float, runtime: str, bound_from: str = "") -> dict:
        """The artifact's outputs over the eval set (one array per output) -> report.json's `task`
        object: score, interval, PyTorch's, drop (interval), bound (and where it came from, in the
        metric's unit), passed, reason."""
        m = self.metric
        base = {"metric": m.name, "chosen": m.why, "higher_is_better": m.higher_is_better, "rows": len(self.labels),
                "runtime": runtime, "torch_score": self.torch_score, "torch_interval": self.torch_interval,
                "max_drop": max_drop, "max_drop_from": bound_from, "unit": m.unit}
        try:
            score = self._score(outputs)
            boot = np.array([self._score(outputs, i) for i in self.resamples])
        except _MetricFailed as e:
            return {**base, "passed": False, "reason": f"task metric {m.name} on this artifact's outputs {e}"}
        sign = 1.0 if m.higher_is_better else -1.0
        drop = sign * (self.torch_score - score)
        passed = drop <= max_drop + 1e-12
        out = {**base, "score": score, "interval": self._interval(score, boot), "drop": drop,
               "drop_interval": _percentiles(sign * (self._torch_boot - boot)), "passed": bool(passed)}
        n = len(self.labels)
        if m.wilson and 1 / n > max_drop:
            # measured (bench/verdicts.py, 64 rows): one row lost flipped a verdict the whole eval set
            # did not support; the verdict stays what was measured, and the report says why it may not hold
            out["resolution"] = (f"{n} labelled rows: one row moves {m.name} by {1 / n:.3g}, more than max_task_drop "
                                 f"{max_drop:g}, so a single row decides this verdict; give at least "
                                 f"{math.floor(1 / max_drop) + 1} labelled rows for a verdict that holds when "
                                 "rows are redrawn")
        if not passed:
            out["reason"] = (f"task {m.name} {score:.4g} vs PyTorch's {self.torch_score:.4g} over {len(self.labels)} "
                             f"labelled rows: a drop of {drop:.4g} (95% CI {out['drop_interval'][0]:.3g} to "
                             f"{out['drop_interval'][1]:.3g}){' ' + m.unit if m.unit else ''} > max_task_drop "
                             f"{max_drop:g}" + (f" (from {bound_from})" if bound_from else "")
                             + (f" ({out['resolution']})" if "resolution" in out else ""))
        return out


class _MetricFailed(Exception):
    pass


def _percentiles(boot: np.ndarray) -> list[float]:
    lo, hi = np.quantile(boot, [(1 - LEVEL) / 2, 1 - (1 - LEVEL) / 2])
    return [float(lo), float(hi)]


# what scoring an accelerator over the whole eval set would cost, measured (docs/BENCHMARKS.md):
# SwiftShader runs ~0.27 s a row on the GPU accelerator and ~0.2 s on WebGPU after their compile
ACCELERATOR_NUMERIC = ("numeric on {n} rows against this artifact's CPU run, whose task score decides (the "
                       "accelerator is not task-scored: on SwiftShader every labelled row would cost ~0.2-0.3 s)")


def checks_judged(res: dict, labelled: bool, rows: int) -> dict[str, str]:
    """Which check of a target's parity record (res) is task-scored and which numeric, in words,
    for report.json (`judged`) and report.html; each accelerator record gets its own line too."""
    out = {}
    t = res.get("task_score")
    out["cpu"] = (f"task {t['metric']} over all {t['rows']} labelled rows on {t['runtime']}" if labelled and t else
                  f"numeric by output kind on {rows} rows against PyTorch on {res.get('runtime')}")
    b = res.get("browser")
    if b is not None:
        out["browser"] = ("not done: " + b["skipped"] if "skipped" in b else
                          f"task {b['task_score']['metric']} over all {b['task_score']['rows']} labelled rows in "
                          "the browser (wasm)" if "task_score" in b else
                          f"numeric on {rows} rows against this artifact's CPU run, whose task score decides"
                          if labelled else f"numeric by output kind on {rows} rows against PyTorch")
    for key in ("gpu_accelerator", "webgpu"):
        rec = res.get(key)
        if rec is None:
            continue
        rec["judged"] = out[key] = (
            "not done: " + str(rec.get("reason")) if not rec.get("done") else
            ACCELERATOR_NUMERIC.format(n=rec["samples"]) if labelled else
            f"numeric by output kind on {rec['samples']} rows against PyTorch")
    if "float16_activations" in res:
        out["float16_activations"] = "numeric: PyTorch with float16 storage; fails only on inf/NaN"
    return out


def stack(rows: list[list[np.ndarray]], like: list[np.ndarray] | None = None) -> list[np.ndarray]:
    """Per-row outputs (each a list of batch-1 arrays) -> one (N, ...) array per output; `like`:
    one row of PyTorch's outputs, whose shapes a runtime's outputs are read in."""
    like = like or rows[0]
    return [np.concatenate([np.asarray(r[k], np.float32).reshape(np.shape(like[k])) for r in rows])
            for k in range(len(like))]
