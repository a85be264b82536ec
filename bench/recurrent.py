"""Recurrent layers before and after convert/module/recurrent.py: litert-torch's own unrolled
export of nn.LSTM / nn.GRU against the fused export (LSTM: UNIDIRECTIONAL_SEQUENCE_LSTM; GRU:
the shorter unrolled graph), on the speaker-encoder shape (3 layers, 256 units, 40 mel features,
T=160) and a small one.

    .venv/bin/python bench/recurrent.py [--only lstm-speaker,...] [--quick] [--kernels]

Per model and export (litert-torch's own, fused float32, fused with int8 LSTM weights as the
dynamic_int8 variant ships it): op count, .tflite size, export seconds (litert-torch convert +
write, the state reset included), latency on ai-edge-litert (XNNPACK + builtin kernels, one
thread) beside PyTorch eager on one thread, timed interleaved (min / median), and the cosine to
PyTorch on one input. The fused LSTMs' full-integer variant (static_int8, the iot target's) runs
on the TFLM interpreter (its reference kernels on this CPU): its arena as TFLM allocates it, its
cosine the mean over 16 sequences, and whether it fits iot's 1 MiB flash and 256 KiB arena.
Prints a markdown table with the machine and date (docs/BENCHMARKS.md).
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

from tpu_pipeline.convert.iot.firmware import measure_arena
from tpu_pipeline.convert.module.export import export_float
from tpu_pipeline.convert.module.loaders import load_object
from tpu_pipeline.convert.module.lstm_int8 import full_integer
from tpu_pipeline.convert.module.lstm_reset import lstm_count
from tpu_pipeline.convert.module.lstm_weights import int8_weights
from tpu_pipeline.convert.module.recurrent import as_fused
from tpu_pipeline.convert.runtimes.litert import LitertRunner
from tpu_pipeline.convert.runtimes.measure import median_ms, torch_threads
from tpu_pipeline.convert.tflite_info import inspect_model
from tpu_pipeline.errors import ConversionError
from tpu_pipeline.testing.recurrent_models import SequenceEncoder

MODELS = {  # name: (SequenceEncoder kwargs, time steps)
    "lstm-speaker": (dict(features=40, hidden=256, layers=3, cell="lstm", out=256, normalize=True), 160),
    "lstm-small": (dict(features=16, hidden=32, layers=1, cell="lstm", out=4), 50),
    "bilstm-small": (dict(features=16, hidden=32, layers=2, cell="lstm", bidirectional=True, batch_first=False,
                          out=4), 50),
    "gru-speaker": (dict(features=40, hidden=256, layers=3, cell="gru", out=256, normalize=True), 160),
    "gru-small": (dict(features=16, hidden=32, layers=1, cell="gru", out=4), 50),
}


def measure(name: str, work: Path, baseline: bool, rounds: int, kernels: bool = False) -> list[dict]:
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
    if kernels and lstm_count(exports["fused float32"][0]):
        # the float LSTM kernel against TFLite's reference one: equal times mean no faster path ran
        exports["fused float32, reference kernels"] = exports["fused float32"][0], None
        runners["fused float32, reference kernels"] = LitertRunner(exports["fused float32"][0],
                                                                   inspect_model(exports["fused float32"][0]),
                                                                   reference=True, threads=1)
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
    if lstm_count(exports["fused float32"][0]):
        try:
            rows.append(_tflm_row(name, net, exports["fused float32"][0], kwargs["features"], steps, eager, rounds))
        except ConversionError as e:  # the variant is not made for this model: say why, time the rest
            print(f"{name}: no full-integer variant: {e}", flush=True)
    for k, (model, export_s) in exports.items():
        got = runners[k].run([x.numpy()])[0]
        cos = float(np.dot(got.ravel(), want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want))
        label = k if k == "litert-torch" or lstm_count(model) else "FusedGRU rewrite float32"
        rows.append({"model": name, "export": label, "ops": len(inspect_model(model).ops), "bytes": len(model),
                     "export_s": export_s, "artifact_ms": (min(times[k]) * 1e3, float(np.median(times[k])) * 1e3),
                     "eager_ms": eager, "max_abs": float(np.abs(got - want).max()), "cosine": cos})
    return rows


def _tflm_row(name: str, net, model: bytes, features: int, steps: int, eager: tuple, rounds: int) -> dict:
    """The full-integer variant (lstm_int8.full_integer, calibrated on 32 random sequences) on TFLM."""
    from tflite_micro.python.tflite_micro import runtime

    key = inspect_model(model).inputs[0].key
    g = torch.Generator().manual_seed(1)
    calib = [torch.randn(1, steps, features, generator=g) for _ in range(32)]
    q = full_integer(model, [{key: x.numpy()} for x in calib])
    info = inspect_model(q)
    arena = measure_arena(q)
    interp = runtime.Interpreter.from_bytes(q, arena_size=max(arena * 2, 1 << 16))
    scale, zp = info.inputs[0].scale, info.inputs[0].zero_point
    oscale, ozp = info.outputs[0].scale, info.outputs[0].zero_point
    xs = [torch.randn(1, steps, features, generator=g) for _ in range(16)]
    cos, times = [], []
    for k in range(max(rounds, len(xs))):
        x = xs[k % len(xs)]
        code = np.clip(np.round(x.numpy() / scale) + zp, -128, 127).astype(np.int8)
        t = time.perf_counter()
        interp.set_input(code, 0)
        interp.invoke()
        times.append(time.perf_counter() - t)
        if k < len(xs):
            got = (np.array(interp.get_output(0)).astype(np.float32) - ozp) * oscale
            with torch.no_grad():
                want = net(x).numpy()
            cos.append(float(np.dot(got.ravel(), want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want)))
    fits = len(q) <= 1 << 20 and arena <= 256 * 1024
    return {"model": name, "export": f"fused, full-integer int8 on TFLM (arena {arena / 1024:.1f} KiB; "
                                     f"{'fits' if fits else 'does not fit'} iot)", "ops": len(info.ops), "bytes": len(q),
            "export_s": None, "artifact_ms": (min(times) * 1e3, float(np.median(times)) * 1e3), "eager_ms": eager,
            "max_abs": None, "cosine": float(np.mean(cos))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    ap.add_argument("--quick", action="store_true", help="the fused exports only (no litert-torch baseline)")
    ap.add_argument("--rounds", type=int, default=50, help="interleaved timing rounds")
    ap.add_argument("--kernels", action="store_true",
                    help="also time the fused float32 artifact on TFLite's reference kernels")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name in a.only.split(","):
            for r in measure(name, Path(d), not a.quick, a.rounds, a.kernels):
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
