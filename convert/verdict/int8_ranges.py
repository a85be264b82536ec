"""int8 calibration defects: each quantized activation's representable range against the
range the float model reaches on the parity rows (issue 19 item 5).

A static-int8 tensor holds [(qmin - zero_point) * scale, (qmax - zero_point) * scale]; a float
value outside it is clipped to the edge. ai-edge-quantizer 0.10 estimates activation ranges by
a moving average (smoothing 0.95) of each calibration row's min/max, so a range settles near the
typical row's extremes, not the largest: the trained pitch net's logits reach 30 in float and
9.4 in int8, its input waveform 1.45 and 0.68. A clipped tensor before a sigmoid caps the output
(issue 19's pitch tracker: several bins tie at 0.648 and argmax reads the lowest).

`clipping(float_model, int8_model, rows)` runs both .tflite files with every tensor preserved,
matches tensors by name (ai-edge-quantizer keeps the float tensor names) and returns, per clipped
tensor, the float range, the representable range, the range the int8 artifact reached and the
share of float values outside. `observed_ranges(model, rows)` is the exact min/max over rows
(quantize.py's "min_max" range estimator).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from tpu_pipeline.convert.runtimes.litert import LitertRunner
from tpu_pipeline.convert.tflite_info import ModelInfo, inspect_model, module_path

QUANTIZED = ("int8", "uint8", "int16")
SLACK_STEPS = 1.0  # a float value within one quantization step of the edge is rounding, not clipping


def representable(t: dict) -> tuple[float, float] | None:
    """[lo, hi] a quantized tensor can hold, in float; None for a float or unquantized tensor.
    int16 activations are symmetric in ai-edge-quantizer (qmin = -qmax)."""
    if t["dtype"] not in QUANTIZED or not t["scale"]:
        return None
    info = np.iinfo(t["dtype"])
    qmin = -info.max if t["dtype"] == "int16" else info.min
    return (qmin - t["zero_point"]) * t["scale"], (info.max - t["zero_point"]) * t["scale"]


def _activations(info: ModelInfo) -> dict[str, int]:
    """name -> index of every tensor computed at run time (inputs and op outputs), not weights."""
    return {t["name"]: i for i, t in info.tensors.items() if not t["constant"]}


def observed_ranges(model: bytes, rows: Iterable[list[np.ndarray]]) -> dict[str, tuple[float, float]]:
    """Exact min/max of every float activation of `model` over `rows` (one array per input)."""
    info = inspect_model(model)
    runner = LitertRunner(model, info, preserve_all=True)
    acts = {n: i for n, i in _activations(info).items() if info.tensors[i]["dtype"].startswith("float")}
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    for row in rows:
        runner.run(row)
        for name, i in acts.items():
            v = runner.tensor(i)
            if v.size:
                lo[name] = min(lo.get(name, np.inf), float(v.min()))
                hi[name] = max(hi.get(name, -np.inf), float(v.max()))
    return {n: (lo[n], hi[n]) for n in lo}


def clipping(float_model: bytes, int8_model: bytes, rows: list[list[np.ndarray]]) -> dict:
    """Per int8 activation matched by name: float range over `rows`, representable range, and the
    share of float values beyond it by more than SLACK_STEPS steps. Returns {"rows", "checked",
    "clipped": [...], "outputs_clipped": [output tensor names]}, clipped sorted outputs first."""
    finfo, qinfo = inspect_model(float_model), inspect_model(int8_model)
    fact, qact = _activations(finfo), _activations(qinfo)
    pairs = {}  # name -> (float index, int8 index, representable range, step)
    for name, qi in qact.items():
        rep = representable(qinfo.tensors[qi])
        if rep is not None and name in fact and finfo.tensors[fact[name]]["dtype"].startswith("float"):
            pairs[name] = (fact[name], qi, rep, qinfo.tensors[qi]["scale"])
    out_names = {t.name for t in qinfo.outputs}
    frun = LitertRunner(float_model, finfo, preserve_all=True)
    qrun = LitertRunner(int8_model, qinfo, preserve_all=True)
    stats = {n: {"lo": np.inf, "hi": -np.inf, "qlo": np.inf, "qhi": -np.inf, "outside": 0, "values": 0}
             for n in pairs}
    for row in rows:
        frun.run(row)
        qrun.run(row)
        for name, (fi, qi, (lo, hi), step) in pairs.items():
            v, s = frun.tensor(fi).astype(np.float64), stats[name]
            t = qinfo.tensors[qi]
            q = (qrun.tensor(qi).astype(np.float64) - t["zero_point"]) * t["scale"]
            s["lo"], s["hi"] = min(s["lo"], float(v.min(initial=np.inf))), max(s["hi"], float(v.max(initial=-np.inf)))
            s["qlo"], s["qhi"] = min(s["qlo"], float(q.min(initial=np.inf))), max(s["qhi"], float(q.max(initial=-np.inf)))
            s["outside"] += int(((v < lo - SLACK_STEPS * step) | (v > hi + SLACK_STEPS * step)).sum())
            s["values"] += int(v.size)
    clipped = []
    for name, (fi, qi, (lo, hi), _step) in pairs.items():
        s = stats[name]
        if not s["outside"]:
            continue
        op = next((o["op"] for o in qinfo.ops if qi in o["outputs"]), "input")
        clipped.append({"tensor": name, "module": module_path(name), "op": op,
                        "role": "output" if name in out_names else ("input" if op == "input" else "activation"),
                        "float_range": [s["lo"], s["hi"]], "representable": [lo, hi],
                        "int8_reached": [s["qlo"], s["qhi"]], "outside_share": s["outside"] / max(s["values"], 1)})
    clipped.sort(key=lambda c: (c["role"] != "output", -c["outside_share"]))
    # an output clipped downstream: the int8 artifact's output reaches less of the float range than its
    # own int8 range holds (the pitch tracker's sigmoid capped at 0.648 by its clipped logits)
    capped = [{"tensor": t.name, "float_range": [stats[t.name]["lo"], stats[t.name]["hi"]],
               "int8_reached": [stats[t.name]["qlo"], stats[t.name]["qhi"]]}
              for t in qinfo.outputs if t.name in stats and _capped(stats[t.name], pairs[t.name][3])]
    return {"rows": len(rows), "checked": len(pairs), "clipped": clipped,
            "outputs_clipped": [c["tensor"] for c in clipped if c["role"] == "output"],
            "outputs_capped": capped}


MATERIAL = 0.01  # an output with more than 1% of its float values outside its int8 range is worth a repair


def material(r: dict | None) -> float:
    """The largest share of an output's float values outside its int8 range (0.0: none, or no check)."""
    return max((c["outside_share"] for c in (r or {}).get("clipped", []) if c["role"] == "output"
                and c["outside_share"] > MATERIAL), default=0.0)


def _capped(s: dict, step: float) -> bool:
    """The int8 output stops more than SLACK_STEPS steps short of the float output's extreme."""
    return s["qhi"] < s["hi"] - (SLACK_STEPS + 1) * step or s["qlo"] > s["lo"] + (SLACK_STEPS + 1) * step


def summary(r: dict) -> str:
    """One line for the report: the clipped tensors that matter, or that none is."""
    if not r.get("clipped") and not r.get("outputs_capped"):
        return f"no int8 tensor clips the float range over {r.get('rows', 0)} rows ({r.get('checked', 0)} checked)"
    parts = [f"{c['module'] or c['tensor']} ({c['role']}): float [{c['float_range'][0]:.3g}, "
             f"{c['float_range'][1]:.3g}] vs int8 [{c['representable'][0]:.3g}, {c['representable'][1]:.3g}], "
             f"{c['outside_share']:.2%} of values outside" for c in r["clipped"][:3]]
    parts += [f"output {c['tensor']} reaches [{c['int8_reached'][0]:.3g}, {c['int8_reached'][1]:.3g}] in int8 (float "
              f"[{c['float_range'][0]:.3g}, {c['float_range'][1]:.3g}])" for c in r.get("outputs_capped", [])]
    more = len(r["clipped"]) - 3
    return (f"int8 ranges clip the float model on {len(r['clipped'])} of {r['checked']} tensors: " + "; ".join(parts)
            + (f"; {more} more" if more > 0 else ""))
