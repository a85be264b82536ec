"""Parity of an artifact against PyTorch: metrics per output, a verdict per
target profile, and localization of the first diverging layer.

`compare(ref, got)` and `judge(...)` are the public library functions the
CLI, the benchmark and every test call.
"""

from __future__ import annotations

import numpy as np
import torch

from tpu_pipeline.convert.runtimes.litert import LitertRunner
from tpu_pipeline.convert.targets import TargetProfile
from tpu_pipeline.convert.tflite_info import ModelInfo, module_path, op_module
from tpu_pipeline.convert.verdict import output_kinds

EPS = 1e-12  # localization's relative layer error only (parity metrics handle zero norms explicitly)
ENVELOPE = 2.0  # a variant may depart from PyTorch by up to 2x what its precision alone does there


def _cosines(rf: np.ndarray, gf: np.ndarray) -> np.ndarray:
    """Per-row cosine, independent of scale (each row is divided by its largest magnitude first,
    so 1e-12 outputs and 1e6 outputs are judged alike). Zero norms are decided, not smoothed:
    both zero = the same output (1.0); only one zero = nothing in common (0.0)."""
    scale = np.maximum(np.abs(rf).max(1, initial=0.0), np.abs(gf).max(1, initial=0.0))
    scale[scale == 0] = 1.0
    r, g = rf / scale[:, None], gf / scale[:, None]
    nr, ng = np.sqrt((r * r).sum(1)), np.sqrt((g * g).sum(1))
    cos = np.empty(len(r))
    both, one = (nr == 0) & (ng == 0), (nr == 0) ^ (ng == 0)
    ok = ~(both | one)
    cos[both], cos[one] = 1.0, 0.0
    cos[ok] = np.clip((r[ok] * g[ok]).sum(1) / (nr[ok] * ng[ok]), -1.0, 1.0)
    return cos


def compare(ref: list[np.ndarray], got: list[np.ndarray], *, kind: str | None = None, classifier: bool = False,
            atol: float = 0.0, rtol: float = 0.0, precision_error: list[float] | None = None) -> dict:
    """One output over all samples: each list holds that output per sample.

    Elementwise: |got - ref| <= atol * scale + rtol * |ref| (+ ENVELOPE x precision_error),
    where scale is the sample's RMS magnitude, so the tolerance follows the output's size
    (1e-12 or 1e6 alike); a sample whose PyTorch output is all zero has no scale and takes
    atol as an absolute bound. precision_error: per sample, the largest error the variant's
    precision alone causes in PyTorch (float16 weights, measured by the model kind): an error
    the precision explains is not a conversion error; anything beyond it still fails.
    kind: the output's kind (output_kinds.OUTPUT_KINDS: logits, probabilities, regression,
    embedding, dense_map, token_logits, unknown), whose figures are added (top-1 only for class
    scores and probabilities, along the last axis); None: "unknown" (numeric figures only).
    classifier=True is kind="logits"."""
    r = np.stack([np.asarray(a, np.float64) for a in ref])
    g = np.stack([np.asarray(a, np.float64).reshape(np.shape(a0)) for a, a0 in zip(got, ref)])
    d = g - r
    rf, gf, df = r.reshape(len(r), -1), g.reshape(len(g), -1), d.reshape(len(d), -1)
    cos = _cosines(rf, gf)
    rms = np.sqrt((rf ** 2).mean(1)) if rf.shape[1] else np.zeros(len(rf))
    scale = np.where(rms > 0, rms, 1.0)
    bound = atol * scale[:, None] + rtol * np.abs(rf)
    envelope = None
    if precision_error is not None:
        envelope = ENVELOPE * np.asarray(precision_error, np.float64)
        within_plain = bool(np.all(np.abs(df) <= bound))
        bound = bound + envelope[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        excess = np.where(bound > 0, np.abs(df) / np.where(bound > 0, bound, 1.0), np.where(df != 0, np.inf, 0.0))
    tiny = np.finfo(np.float64).tiny
    out = {
        "max_abs": float(np.abs(d).max(initial=0.0)),
        "rmse": float(np.sqrt((d ** 2).mean())) if d.size else 0.0,
        "cosine": float(cos.min()),          # worst sample
        "cosine_mean": float(cos.mean()),
        # per-sample scale divided out, so 1e-12 outputs do not underflow into a 0 dB figure; a difference
        # of the logs, since signal / tiny overflows to inf when the outputs match exactly (int outputs)
        "snr_db": float(10 * (np.log10(max(((rf / scale[:, None]) ** 2).sum(), tiny)) -
                              np.log10(max(((df / scale[:, None]) ** 2).sum(), tiny)))),
        "scale": float(rms.max(initial=0.0)),  # largest per-sample RMS of the PyTorch output
        "within_tol": bool(np.all((np.abs(df) <= bound))),
        "tol_ratio": float(np.nan_to_num(excess, posinf=np.finfo(np.float64).max).max(initial=0.0)),
        "samples": int(len(r)),
        "nonfinite_samples": int((~np.isfinite(gf)).any(1).sum()) if gf.size else 0,
    }
    if envelope is not None:
        out["precision_envelope"] = float(envelope.max(initial=0.0))
        out["within_tol_without_envelope"] = within_plain
    kind = kind or ("logits" if classifier else "unknown")
    out["kind"] = kind
    if np.isfinite(gf).all():
        out.update(output_kinds.get(kind).figures(r, g))
    return out


def verdict(per_output: dict[str, dict], profile: TargetProfile, *, atol=None, rtol=None,
            min_cosine=None) -> dict:
    """Each criterion per output with its value, bound and outcome, and which decided:
    {"passed", "reasons", "decided_by", "checks": {output: [{criterion, value, bound, passed}]},
    "notes"}. Each output's kind (m["kind"], output_kinds.py) adds its task criteria (top-1 and
    flip rate + probability error for class scores and probabilities, error relative to the
    reference's spread for regression, ...). Float variants: worst-sample cosine + elementwise
    tolerance beside them; int8 (rounding error is distributional): the kind's criteria alone,
    or mean cosine for an output of unknown kind."""
    min_cos = profile.min_cosine if min_cosine is None else min_cosine
    check_abs = profile.check_abs or atol is not None or rtol is not None
    a = profile.atol if atol is None else atol
    r_ = profile.rtol if rtol is None else rtol
    reasons, checks, notes, failed = [], {}, [], []
    for name, m in per_output.items():
        if m.get("nonfinite_samples"):
            reasons.append(f"{name}: the artifact outputs NaN/inf on {m['nonfinite_samples']} of {m['samples']} "
                           "samples (PyTorch's are finite)")
        kind = m.get("kind", "unknown")
        judge_kind = output_kinds.get(kind)
        rows = []
        # int8 targets judge an output of known kind by its task's criteria only (a pitch read right
        # at mean cosine 0.96 is right); float targets keep cosine and elementwise beside them, since
        # a float artifact departing from PyTorch at all is a conversion error
        numeric = profile.check_abs or not judge_kind.task_criteria or min_cosine is not None
        if numeric:
            key, label = ("cosine", "cosine (worst sample)") if profile.check_abs else ("cosine_mean", "mean cosine")
            rows.append({"criterion": "cosine", "value": m[key], "bound": min_cos, "passed": m[key] >= min_cos})
            if not rows[-1]["passed"]:
                reasons.append(f"{name}: {label} {m[key]:.6f} < {min_cos}")
        if kind == "unknown":
            notes.append(f"{name}: kind unknown (neither inferred from the graph nor given): judged numerically; "
                         f"give it with --output-kind {name}=KIND ({', '.join(output_kinds.names())})")
        if check_abs:
            env = m.get("precision_envelope")
            extra = f" + {ENVELOPE:g} x the precision's own error ({env / ENVELOPE:.3g})" if env is not None else ""
            rows.append({"criterion": "elementwise", "value": m["max_abs"],
                         "bound": f"atol {a} x scale + rtol {r_}{extra}", "passed": m["within_tol"]})
            if not m["within_tol"]:
                reasons.append(f"{name}: max_abs {m['max_abs']:.3g} outside atol {a} x scale {m['scale']:.3g} "
                               f"+ rtol {r_}{extra} (worst element at {m['tol_ratio']:.3g}x its bound)")
            elif env is not None and not m.get("within_tol_without_envelope", True):
                notes.append(f"{name}: max_abs {m['max_abs']:.3g} is outside atol {a} x scale + rtol {r_} but within "
                             f"{ENVELOPE:g}x the error the precision alone causes in PyTorch ({env / ENVELOPE:.3g}): "
                             "precision loss, not a conversion error")
        if not m.get("nonfinite_samples"):
            for criterion, value, bound, ok, why in judge_kind.checks(m, profile):
                rows.append({"criterion": criterion, "value": value, "bound": bound, "passed": bool(ok)})
                if not ok:
                    reasons.append(f"{name}: {why}")
        if m.get("top1_near_ties"):
            notes.append(f"{name}: top-1 flipped on {m['top1_near_ties']} of {m['top1_rows']} rows whose PyTorch "
                         f"top-2 gap is within float32 noise ({output_kinds.TIE_NOISE:g} x the row's scale): "
                         "near-ties, reported, not counted against agreement")
        checks[name] = rows
        failed += [f"{name}: {row['criterion']}" for row in rows if not row["passed"]]
    decided = failed or ["all criteria passed: " + ", ".join(dict.fromkeys(
        row["criterion"] for rows in checks.values() for row in rows))]
    return {"passed": not reasons, "reasons": reasons, "decided_by": decided, "checks": checks, "notes": notes}


def judge(per_output: dict[str, dict], profile: TargetProfile, *, atol=None, rtol=None, min_cosine=None) -> tuple[bool, list[str]]:
    """-> (passed, reasons it failed). Tolerances: the profile's, unless overridden."""
    v = verdict(per_output, profile, atol=atol, rtol=rtol, min_cosine=min_cosine)
    return v["passed"], v["reasons"]


def tolerances(profile: TargetProfile, atol=None, rtol=None, min_cosine=None) -> dict:
    return {"atol": profile.atol if atol is None else atol, "rtol": profile.rtol if rtol is None else rtol,
            "min_cosine": profile.min_cosine if min_cosine is None else min_cosine, "min_top1": profile.min_top1,
            "max_flip_rate": profile.max_flip_rate, "max_prob_error": profile.max_prob_error,
            "max_regression_error": profile.max_regression_error,
            "max_regression_mean_error": profile.max_regression_mean_error,
            "min_nn_agreement": profile.min_nn_agreement, "min_pixel_agreement": profile.min_pixel_agreement,
            "min_psnr_db": profile.min_psnr_db,
            "elementwise": bool(profile.check_abs or atol is not None or rtol is not None)}


def stack_path(path: str) -> str:
    """nn_module_stack paths as module paths: "L['self'].blocks.3" / "L__self___blocks_3" styles
    come from older torch.export; this torch writes "blocks.3"."""
    for prefix in ("L['self'].", "L['self']"):
        if path.startswith(prefix):
            return path[len(prefix):]
    return path


def _graph_activations(gm: torch.fx.GraphModule, args) -> dict[str, np.ndarray]:
    """Module outputs of an exported program's graph (ep.module()): its submodules never run as
    modules (forward hooks see nothing), but each node records the module stack it was traced
    in (`nn_module_stack`). A module's output is the last node computed inside it."""
    acts: dict[str, np.ndarray] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            stack = n.meta.get("nn_module_stack") if n.op == "call_function" else None
            if stack and isinstance(out, torch.Tensor) and out.is_floating_point():
                for path, _type in stack.values():
                    if stack_path(path):
                        acts[stack_path(path)] = out.detach().float().numpy()
            return out

    with torch.no_grad():
        Recorder(gm).run(*args)
    return acts


def activations(module: torch.nn.Module, args) -> dict[str, np.ndarray]:
    """Each submodule's output (float32 numpy), in execution order, keyed by module path."""
    if isinstance(module, torch.fx.GraphModule) and any(
            n.meta.get("nn_module_stack") for n in module.graph.nodes):
        try:
            return _graph_activations(module, args)
        except Exception:  # noqa: BLE001 - graphs the plain interpreter cannot run fall back to hooks
            pass
    acts: dict[str, np.ndarray] = {}
    hooks = []
    for name, sub in module.named_modules():
        if not name:
            continue

        def hook(_m, _i, out, name=name):
            if isinstance(out, torch.Tensor) and out.is_floating_point():
                acts[name] = out.detach().float().numpy()

        hooks.append(sub.register_forward_hook(hook))
    try:
        with torch.no_grad():
            module(*args)
    finally:
        for h in hooks:
            h.remove()
    return acts


def _align(t: np.ndarray, ref: np.ndarray) -> np.ndarray | None:
    if t.size != ref.size:
        return None
    if t.shape == ref.shape:
        return t
    if t.ndim == 4 and ref.ndim == 4 and t.shape == (ref.shape[0], ref.shape[2], ref.shape[3], ref.shape[1]):
        return t.transpose(0, 3, 1, 2)  # LiteRT keeps activations NHWC
    return t.reshape(ref.shape)


def localize(module: torch.nn.Module, samples: list, model: bytes, info: ModelInfo) -> dict | None:
    """First layer (in execution order) whose output departs from PyTorch's, judged against the
    final output's error, averaged over `samples` (lists of numpy inputs):
    returns {"module", "op", "rel_err", "layers": [...]} or None."""
    runs = [_layer_errors(module, s, model, info) for s in samples]
    if not runs or not runs[0]:
        return None
    layers = []
    for rows in zip(*runs):
        layers.append({**rows[0], "rel_err": float(np.mean([r["rel_err"] for r in rows]))})
    return _first_divergence(layers)


def _fused_variants(ref: np.ndarray):
    # LiteRT fuses a following ReLU/ReLU6 into conv/FC outputs; PyTorch's hook saw the value before it.
    yield ref
    yield np.maximum(ref, 0)
    yield np.clip(ref, 0, 6)


def _fused_modules(info: ModelInfo, op: dict, path: str) -> list[str]:
    """The other PyTorch modules one LiteRT op computes (conv + BatchNorm + ReLU6 fused: the
    output tensor's name lists each location, separated by ';')."""
    found: list[str] = []
    for idx in op["outputs"]:
        for segment in info.tensors.get(idx, {}).get("name", "").split(";"):
            p = module_path(segment)
            if p and p != path and p not in found:
                found.append(p)
    return found


def _layer_errors(module, sample, model, info) -> list[dict]:
    args = [torch.from_numpy(np.asarray(x)) for x in sample]
    acts = activations(module, args)
    runner = LitertRunner(model, info, reference=True, preserve_all=True)
    runner.run(list(sample))
    layers = []
    for op in info.ops:
        path = op_module(info, op)
        if not path or path not in acts:
            continue
        out_idx = op["outputs"][0]
        t = info.tensors[out_idx]
        try:
            raw = runner.tensor(out_idx)
        except ValueError:
            continue
        val = raw.astype(np.float32)
        if t["scale"]:
            val = (val - t["zero_point"]) * t["scale"]
        elif not np.issubdtype(raw.dtype, np.floating):
            continue
        ref = acts[path]
        aligned = _align(val, ref)
        if aligned is None:
            continue
        rel = min(float(np.sqrt(((aligned - r) ** 2).sum()) / (np.sqrt((r * r).sum()) + EPS))
                  for r in _fused_variants(ref))
        row = {"module": path, "op": op["op"], "op_index": op["index"], "rel_err": rel}
        fused = _fused_modules(info, op, path)
        if fused:
            row["fused_with"] = ", ".join(fused)
        layers.append(row)
    return layers


def _first_divergence(layers: list[dict]) -> dict | None:
    if not layers:
        return None
    # The module's last op is the one whose output PyTorch's hook saw.
    last = {}
    for row in layers:
        last[row["module"]] = row
    rows = sorted(last.values(), key=lambda r: r["op_index"])
    final = max(r["rel_err"] for r in rows[-1:]) if rows else 0.0
    threshold = max(1e-3, 0.5 * final)
    for row in rows:
        if row["rel_err"] >= threshold:
            return {**row, "threshold": threshold, "layers": rows}
    worst = max(rows, key=lambda r: r["rel_err"])
    return {**worst, "threshold": threshold, "layers": rows}
