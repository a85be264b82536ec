"""Recurrent layers before and after convert/module/recurrent.py: litert-torch's own unrolled
export of nn.LSTM / nn.GRU against the fused export (LSTM: UNIDIRECTIONAL_SEQUENCE_LSTM; GRU:
the shorter unrolled graph), on the speaker-encoder shape (3 layers, 256 units, 40 mel features,
T=160) and a small one.

    .venv/bin/python bench/recurrent.py [--only lstm-speaker,...] [--quick]

Per model and export (litert-torch's own, fused float32, fused with int8 LSTM weights as the
dynamic_int8 variant ships it): op count, .tflite size, export seconds (litert-torch convert +
write, the state reset included), latency on ai-edge-litert (XNNPACK + builtin kernels, one
thread) beside PyTorch eager on one thread, timed interleaved (min / median), and the cosine to
PyTorch on one input. Prints a markdown table with the machine and date (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import tempfile
import time
from pathlib import Path

import litert_torch  # noqa: F401 - its ~8 s import happens before any export is timed
import numpy as np
import torch

from tpu_pipeline.convert.measure import median_ms, torch_threads
from tpu_pipeline.convert.module.export import export_float
from tpu_pipeline.convert.module.loaders import load_object
from tpu_pipeline.convert.module.lstm_reset import lstm_count
from tpu_pipeline.convert.module.lstm_weights import int8_weights
from tpu_pipeline.convert.module.recurrent import as_fused
from tpu_pipeline.convert.runtimes import LitertRunner
from tpu_pipeline.convert.tflite_info import inspect_model
from tpu_pipeline.testing.recurrent_models import SequenceEncoder

MODELS = {  # name: (SequenceEncoder kwargs, time steps)
    "lstm-speaker": (dict(features=40, hidden=256, layers=3, cell="lstm", out=256, normalize=True), 160),
    "lstm-small": (dict(features=16, hidden=32, layers=1, cell="lstm", out=4), 50),
    "bilstm-small": (dict(features=16, hidden=32, layers=2, cell="lstm", bidirectional=True, batch_first=False,
                          out=4), 50),
    "gru-speaker": (dict(features=40, hidden=256, layers=3, cell="gru", out=256, normalize=True), 160),
    "gru-small": (dict(features=16, hidden=32, layers=1, cell="gru", out=4), 50),
}


def measure(name: str, work: Path, baseline: bool, rounds: int) -> list[dict]:
    """Exports `name` (litert-torch's own when `baseline`, and fused), then times PyTorch eager and
    each artifact interleaved, `rounds` times each: on a shared machine the minimum is the stable
    figure, the median is shown beside it."""
    kwargs, steps = MODELS[name]
    torch.manual_seed(0)
    net = SequenceEncoder(**kwargs).eval()
    x = torch.randn(1, steps, kwargs["features"])
    exports = {}
    for fused in ((False, True) if baseline else (True,)):
        t0 = time.perf_counter()
        model = export_float(load_object(as_fused(net, (x,))[0] if fused else net, (x,)), work / f"{name}-{fused}.tflite")
        exports["fused float32" if fused else "litert-torch"] = (model, time.perf_counter() - t0)
    if lstm_count(exports["fused float32"][0]):
        exports["fused, int8 LSTM weights"] = (int8_weights(exports["fused float32"][0]), None)
    runners = {k: LitertRunner(m, inspect_model(m), threads=1) for k, (m, _) in exports.items()}
    times: dict[str, list[float]] = {k: [] for k in ["eager", *runners]}
    with torch.no_grad(), torch_threads(1):
        want = net(x).numpy()
        for _ in range(rounds):
            t = time.perf_counter()
            net(x)
            times["eager"].append(time.perf_counter() - t)
            for k, r in runners.items():
                t = time.perf_counter()
                r.run([x.numpy()])
                times[k].append(time.perf_counter() - t)
    eager = (min(times["eager"]) * 1e3, float(np.median(times["eager"])) * 1e3)
    rows = []
    for k, (model, export_s) in exports.items():
        got = runners[k].run([x.numpy()])[0]
        cos = float(np.dot(got.ravel(), want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want))
        label = k if k == "litert-torch" or lstm_count(model) else "FusedGRU rewrite float32"
        rows.append({"model": name, "export": label, "ops": len(inspect_model(model).ops), "bytes": len(model),
                     "export_s": export_s, "artifact_ms": (min(times[k]) * 1e3, float(np.median(times[k])) * 1e3),
                     "eager_ms": eager, "max_abs": float(np.abs(got - want).max()), "cosine": cos})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    ap.add_argument("--quick", action="store_true", help="the fused exports only (no litert-torch baseline)")
    ap.add_argument("--rounds", type=int, default=50, help="interleaved timing rounds")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name in a.only.split(","):
            for r in measure(name, Path(d), not a.quick, a.rounds):
                rows.append(r)
                print(r, flush=True)
    print(f"\n{platform.node()} ({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}), "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, torch {torch.__version__}; "
          "ms: min / median of the interleaved rounds, one thread\n")
    print("| model | export | ops | size | export s | artifact ms | eager ms | eager/artifact (min) | cosine |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        (a_min, a_med), (e_min, e_med) = r["artifact_ms"], r["eager_ms"]
        export_s = "-" if r["export_s"] is None else f"{r['export_s']:.1f}"
        print(f"| {r['model']} | {r['export']} | {r['ops']} | {r['bytes'] / 1e6:.2f} MB | {export_s} | "
              f"{a_min:.2f} / {a_med:.2f} | {e_min:.2f} / {e_med:.2f} | {e_min / a_min:.2f}x | {r['cosine']:.6f} |")


if __name__ == "__main__":
    main()
