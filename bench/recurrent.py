"""Recurrent layers before and after convert/module/recurrent.py: litert-torch's own unrolled
export of nn.LSTM / nn.GRU against the fused export (LSTM: UNIDIRECTIONAL_SEQUENCE_LSTM; GRU:
the shorter unrolled graph), on the speaker-encoder shape (3 layers, 256 units, 40 mel features,
T=160) and a small one.

    .venv/bin/python bench/recurrent.py [--only lstm-speaker,...] [--quick]

Per model and export: op count, .tflite size, export seconds (litert-torch convert + write, the
state reset included), the float32 artifact's median latency on ai-edge-litert (XNNPACK, one
thread) beside PyTorch eager on one thread, and max |artifact - PyTorch| on one input. Prints a
markdown table with the machine and date (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from tpu_pipeline.convert.measure import median_ms, torch_threads
from tpu_pipeline.convert.module.export import export_float
from tpu_pipeline.convert.module.loaders import load_object
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


def measure(name: str, fused: bool, work: Path) -> dict:
    kwargs, steps = MODELS[name]
    torch.manual_seed(0)
    net = SequenceEncoder(**kwargs).eval()
    x = torch.randn(1, steps, kwargs["features"])
    module = as_fused(net, (x,))[0] if fused else net
    t0 = time.perf_counter()
    model = export_float(load_object(module, (x,)), work / f"{name}-{fused}.tflite")
    export_s = time.perf_counter() - t0
    info = inspect_model(model)
    runner = LitertRunner(model, info, threads=1)
    with torch.no_grad(), torch_threads(1):
        want = net(x).numpy()
        eager = median_ms(lambda: net(x), budget_s=1.0)
    err = float(np.abs(runner.run([x.numpy()])[0] - want).max())
    return {"model": name, "export": "fused" if fused else "litert-torch", "ops": len(info.ops),
            "bytes": len(model), "export_s": export_s, "artifact_ms": runner.latency_ms([x.numpy()], budget_s=1.0),
            "eager_ms": eager, "max_abs": err}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    ap.add_argument("--quick", action="store_true", help="the fused exports only (no litert-torch baseline)")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name in a.only.split(","):
            for fused in ((True,) if a.quick else (False, True)):
                rows.append(r := measure(name, fused, Path(d)))
                print(r, flush=True)
    print(f"\n{platform.node()} ({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}), "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, torch {torch.__version__}\n")
    print("| model | export | ops | size | export s | artifact ms (1 thread) | eager ms (1 thread) | ratio | max abs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['export']} | {r['ops']} | {r['bytes'] / 1e6:.2f} MB | {r['export_s']:.1f} | "
              f"{r['artifact_ms']:.2f} | {r['eager_ms']:.2f} | {r['eager_ms'] / r['artifact_ms']:.2f}x | "
              f"{r['max_abs']:.1e} |")


if __name__ == "__main__":
    main()
