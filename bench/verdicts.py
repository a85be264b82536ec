"""Does convert's verdict follow the task, and hold when the parity rows are redrawn?

For each trained model of tpu_pipeline.testing.trained_models (digits CNN, sigmoid pitch
tracker, box regressor; trained here in seconds) and each target: the tool's verdict, the
artifact's task metric on the held-out eval set against PyTorch's, and over REDRAWS seeds how
often the verdict equalled the first one. Rows are redrawn by the bench itself (an .npz of
`--rows` eval rows drawn with each seed, passed as --eval-data), so the same script measures
a checkout without --seed redraws (before issue 19) and one with them.

--labels also gives the eval rows' labels and the model's task metric (--eval-data labels,
metric=): the task score over those rows then decides (issue 19 item 2); without it the
verdict is numeric parity by output kind. --models picks the trained models (default: every
one, the planted clipped-int8 pitch tracker and the recurrent model included).

CPU command (about 5 minutes on 2 shared cores):
    nice -n 5 .venv/bin/python bench/verdicts.py --out runs/bench_verdicts
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from tpu_pipeline.convert import ConvertOptions, convert
from tpu_pipeline.convert.runtimes.litert import LitertRunner, run_micro
from tpu_pipeline.convert.tflite_info import inspect_model
from tpu_pipeline.testing import trained_models

# what the task tolerates: accuracy / mean-IoU points
TASK_DROP = {"digits": 0.01, "pitch": 0.02, "boxes": 0.02, "clipped_pitch": 0.02, "first_pulse": 0.01}
ALL = {**trained_models.BUILDERS, **trained_models.PLANTED, **trained_models.RECURRENT}
HAS_KINDS = "output_kinds" in {f.name for f in dataclasses.fields(ConvertOptions)}


def task_score(model: bytes, tr, runtime: str) -> float:
    """The artifact's task metric over the whole eval set, on the runtime the tool judged it on
    (iot: the TFLM interpreter; else ai-edge-litert's XNNPACK)."""
    info = inspect_model(model)
    rows = [[x[None]] for x in tr.eval_x]
    if runtime == "tflite-micro":
        got = run_micro(model, info, rows, 64 * 1024 * 1024)
    else:
        runner = LitertRunner(model, info)
        got = [runner.run(r) for r in rows]
    return tr.metric(np.concatenate([g[0].reshape(1, -1) for g in got]), tr.eval_y)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--targets", default="desktop,android,web,iot")
    ap.add_argument("--redraws", type=int, default=5)
    ap.add_argument("--rows", type=int, default=0, help="eval rows per redraw (0: the tool's default)")
    ap.add_argument("--labels", action="store_true", help="give the rows' labels and the task metric")
    ap.add_argument("--models", default=",".join(ALL))
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in a.models.split(","):
        tr = ALL[name]()
        with torch.no_grad():
            torch_score = tr.metric(tr.module(torch.from_numpy(tr.eval_x)).numpy(), tr.eval_y)
        n_rows = a.rows or (64 if HAS_KINDS else 8)
        verdicts, scores, seconds = [], {}, []
        for seed in range(a.redraws):
            pick = np.random.default_rng(seed).choice(len(tr.eval_x), n_rows, replace=False)
            with tempfile.TemporaryDirectory() as tmp:
                npz = Path(tmp) / "eval.npz"
                np.savez(npz, tr.eval_x[pick], **({"labels": tr.eval_y[pick]} if a.labels else {}))
                extra = {"output_kinds": {"output_0": tr.output_kind}} if HAS_KINDS and tr.output_kind else {}
                if a.labels:
                    extra["metric"] = tr.metric
                t0 = time.perf_counter()
                r = convert(tr.module, (tr.example,), targets=a.targets, out=Path(tmp) / "out",
                            calibration=[(torch.from_numpy(x[None]),) for x in tr.calib], latency=False,
                            eval_data=str(npz), samples=n_rows, seed=seed, **extra)
                seconds.append(time.perf_counter() - t0)
                verdicts.append({t: res.passed for t, res in r.targets.items()})
                if seed == 0:
                    for t, res in r.targets.items():
                        bound = ((res.parity or {}).get("task_score") or {}).get("max_drop")  # with labels
                        scores[t] = (task_score(res.artifact.model, tr, (res.metrics or {}).get("runtime"))
                                     if res.artifact is not None else None, res.quantization, res.errors[:1], bound)
        for t in verdicts[0]:
            score, quant, why, bound = scores[t]
            held = sum(v[t] == verdicts[0][t] for v in verdicts) / len(verdicts)
            rows.append({"model": name, "target": t, "quantization": quant, "verdict": verdicts[0][t],
                         "task": score, "torch": torch_score,
                         "task_ok": None if score is None else score >= torch_score - TASK_DROP[name],
                         "profile_bound": bound,  # the tool's max_task_drop (labels only), on the whole eval set
                         "task_ok_at_bound": None if score is None or bound is None else score >= torch_score - bound,
                         "held": held, "why": why, "rows": n_rows, "convert_s": float(np.median(seconds))})
            print(json.dumps(rows[-1]), flush=True)
    (a.out / "verdicts.json").write_text(json.dumps(rows, indent=1))
    lines = ["| model | target | quantization | verdict | task metric (PyTorch) | task holds (at the profile's "
             f"bound) | verdict held over {a.redraws} redraws |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        task = "-" if r["task"] is None else f"{r['task']:.3f} ({r['torch']:.3f})"
        at = "" if r["task_ok_at_bound"] is None else f" ({r['task_ok_at_bound']} at {r['profile_bound']:g})"
        lines.append(f"| {r['model']} | {r['target']} | {r['quantization']} | {'ship' if r['verdict'] else 'refuse'} | "
                     f"{task} | {r['task_ok']}{at} | {r['held']:.0%} |")
    (a.out / "verdicts.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
