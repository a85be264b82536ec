"""int8 calibration defects and their repairs (issue 19 item 5), per trained model, on iot
(full-integer static int8 on the TFLM interpreter).

For each model of tpu_pipeline.testing.trained_models (default: the pitch tracker, the planted
clipped_pitch calibrated on mostly-silent rows, the first_pulse GRU), with and without labels
(--eval-data labels: the task score decides; without: numeric parity by output kind), two runs:
--refine-rounds 0 (no repair: the verdict as convert gave it before the range check) and the
default (repairs tried). Per run: the verdict, the shipped artifact's task metric on XNNPACK
against PyTorch's, its bytes and latency, the clipped tensors named and the repair chosen with
its cost (bytes added, latency before -> after). One JSON line per run.

CPU command (about 4 minutes on 2 shared cores):
    nice -n 5 .venv/bin/python bench/int8_repairs.py --out runs/bench_int8_repairs
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from tpu_pipeline.convert import convert
from tpu_pipeline.convert.runtimes.litert import LitertRunner
from tpu_pipeline.convert.tflite_info import inspect_model
from tpu_pipeline.testing import trained_models

ALL = {**trained_models.BUILDERS, **trained_models.PLANTED, **trained_models.RECURRENT}


def _task(model: bytes, tr) -> float:
    runner = LitertRunner(model, inspect_model(model))
    return tr.metric(np.concatenate([runner.run([x[None]])[0].reshape(1, -1) for x in tr.eval_x]), tr.eval_y)


def run(name: str, out: Path) -> list[dict]:
    tr = ALL[name]()
    with torch.no_grad():
        torch_score = tr.metric(tr.module(torch.from_numpy(tr.eval_x)).numpy(), tr.eval_y)
    rows = []
    for labels in (False, True):
        npz = out / f"{name}-labels{int(labels)}.npz"
        np.savez(npz, tr.eval_x, **({"labels": tr.eval_y} if labels else {}))
        for rounds in (0, 4):
            t0 = time.perf_counter()
            r = convert(tr.module, (tr.example,), targets="iot", out=out / f"{name}-labels{int(labels)}-rounds{rounds}",
                        calibration=[(torch.from_numpy(x[None]),) for x in tr.calib], eval_data=str(npz),
                        refine_rounds=rounds, output_kinds={"output_0": tr.output_kind} if tr.output_kind else {})
            t = r["iot"]
            rep = t.int8_repairs or {}
            chosen = next((x for x in rep.get("repairs", []) if x.get("repair") == rep.get("chosen")), {})
            clipped = (t.parity or {}).get("int8_ranges", {}).get("clipped", [])
            rows.append({"model": name, "labels": labels, "refine_rounds": rounds, "passed": t.passed,
                         "task": _task(t.artifact.model, tr), "torch_task": torch_score, "bytes": t.size_bytes,
                         "latency_ms": t.latency, "clipped_before": rep.get("clipped") or list(dict.fromkeys(
                             c["module"] or c["tensor"] for c in clipped))[:8],
                         "repair": rep.get("chosen"), "repair_bytes_added": chosen.get("bytes_added"),
                         "repair_latency_ms": [chosen.get("latency_ms_before"), chosen.get("latency_ms")],
                         "reason": t.reasons[:1], "wall_s": round(time.perf_counter() - t0, 1)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="pitch,clipped_pitch,first_pulse", help=f"comma list of {', '.join(ALL)}")
    ap.add_argument("--out", default="runs/bench_int8_repairs", help="folder for the conversions and results.json")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [row for name in args.models.split(",") for row in run(name.strip(), out)]
    (out / "results.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
