"""Parity of an artifact against PyTorch: metrics per output, a verdict per
target profile, and localization of the first diverging layer.

`compare(ref, got)` and `judge(...)` are the public library functions the
CLI, the benchmark and every test call.
"""

from __future__ import annotations

import numpy as np
import torch

from tpu_pipeline.convert.runtimes import LitertRunner
from tpu_pipeline.convert.targets import TargetProfile
from tpu_pipeline.convert.tflite_info import ModelInfo, op_module

EPS = 1e-12


def compare(ref: list[np.ndarray], got: list[np.ndarray], *, classifier: bool, atol: float = 0.0,
            rtol: float = 0.0) -> dict:
    """One output over all samples: each list holds that output per sample."""
    r = np.stack([np.asarray(a, np.float64) for a in ref])
    g = np.stack([np.asarray(a, np.float64).reshape(np.shape(a0)) for a, a0 in zip(got, ref)])
    d = g - r
    rf, gf = r.reshape(len(r), -1), g.reshape(len(g), -1)
    cos = (rf * gf).sum(1) / (np.linalg.norm(rf, axis=1) * np.linalg.norm(gf, axis=1) + EPS)
    out = {
        "max_abs": float(np.abs(d).max()),
        "rmse": float(np.sqrt((d ** 2).mean())),
        "cosine": float(cos.min()),          # worst sample
        "cosine_mean": float(cos.mean()),
        "snr_db": float(10 * np.log10(((r ** 2).sum() + EPS) / ((d ** 2).sum() + EPS))),
        "within_tol": bool(np.all(np.abs(d) <= atol + rtol * np.abs(r))),
        "samples": int(len(r)),
    }
    if classifier and r.shape[-1] > 1:
        out["top1"] = float((r.argmax(-1) == g.argmax(-1)).mean())
    return out


def judge(per_output: dict[str, dict], profile: TargetProfile, *, atol=None, rtol=None, min_cosine=None) -> tuple[bool, list[str]]:
    """-> (passed, reasons it failed). Tolerances: the profile's, unless overridden."""
    min_cos = profile.min_cosine if min_cosine is None else min_cosine
    check_abs = profile.check_abs or atol is not None or rtol is not None
    reasons = []
    for name, m in per_output.items():
        # float variants: the worst sample must match; int8 (judged without elementwise
        # tolerance): the mean over samples, since rounding error is distributional.
        key, label = ("cosine", "cosine (worst sample)") if profile.check_abs else ("cosine_mean", "mean cosine")
        if m[key] < min_cos:
            reasons.append(f"{name}: {label} {m[key]:.6f} < {min_cos}")
        if "top1" in m and m["top1"] < profile.min_top1:
            reasons.append(f"{name}: top-1 agreement {m['top1']:.3f} < {profile.min_top1}")
        if check_abs and not m["within_tol"]:
            a = profile.atol if atol is None else atol
            r = profile.rtol if rtol is None else rtol
            reasons.append(f"{name}: max_abs {m['max_abs']:.3g} outside atol {a} + rtol {r}")
    return not reasons, reasons


def tolerances(profile: TargetProfile, atol=None, rtol=None, min_cosine=None) -> dict:
    return {"atol": profile.atol if atol is None else atol, "rtol": profile.rtol if rtol is None else rtol,
            "min_cosine": profile.min_cosine if min_cosine is None else min_cosine, "min_top1": profile.min_top1,
            "elementwise": bool(profile.check_abs or atol is not None or rtol is not None)}


def _torch_activations(module: torch.nn.Module, args) -> dict[str, np.ndarray]:
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


def _layer_errors(module, sample, model, info) -> list[dict]:
    args = [torch.from_numpy(np.asarray(x)) for x in sample]
    acts = _torch_activations(module, args)
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
        rel = min(float(np.linalg.norm(aligned - r) / (np.linalg.norm(r) + EPS)) for r in _fused_variants(ref))
        layers.append({"module": path, "op": op["op"], "op_index": op["index"], "rel_err": rel})
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
