"""tpu-pipeline's android artifact against ExecuTorch's XNNPACK programs on the same weights (issue 40).

    make bench-executorch                      # builds .venv-executorch (ExecuTorch 1.5.1) once, then runs this
    .venv/bin/python bench/vs_executorch.py [--only cnn,lstm] [--rounds 5] [--runs 50]

Per model: tpu-pipeline's convert (targets desktop,android; calibration rows given, the labelled
eval rows where the model has labels) and what android ships; ExecuTorch fp32
(`to_edge_transform_and_lower` with XnnpackPartitioner) and PT2E int8 (XNNPACKQuantizer, symmetric
per-channel, calibrated on the same rows) from the same torch.export'ed program. Latency: median ms
of `--runs` calls on one row, 1 and 2 threads, the four programs interleaved over `--rounds` rounds
(the median of the round medians), each tool in its own process (ExecuTorch's in
bench/executorch_side.py under .venv-executorch). Cosine: mean over the eval rows of each program's
output against PyTorch's; accuracy where the model has labels. Conversion seconds: convert's wall
(every check included) against ExecuTorch's lowering (int8: quantize + calibrate + lower). Models are
small so the run takes minutes: trained digits CNN, MobileNetV2 and ViT from transformers with
trained-like statistics (tpu_pipeline.testing.zoo), a transformer encoder, an LSTM classifier and a
conformer-style audio block. Prints a markdown table with the machine and date (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

import tpu_pipeline.convert as tc
from tpu_pipeline.convert.runtimes.litert import LitertRunner
from tpu_pipeline.convert.tflite_info import inspect_model
from tpu_pipeline.testing import trained_models, zoo

ROOT = Path(__file__).resolve().parent.parent
ET_PYTHON = ROOT / ".venv-executorch" / "bin" / "python"
CALIB_ROWS, EVAL_ROWS = 32, 32


@dataclasses.dataclass
class Case:
    module: nn.Module
    calib: list[np.ndarray]  # rows [1, ...] of the one input
    eval_x: np.ndarray       # [N, ...]
    labels: np.ndarray | None = None


class Encoder(nn.Module):
    """The issue's transformer encoder: 4 layers, d 128, 4 heads, 64 tokens, GELU, mean-pooled head."""

    def __init__(self, d=128, layers=4, classes=10):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True, activation="gelu")
        self.enc, self.head = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False), nn.Linear(d, classes)

    def forward(self, x):
        return self.head(self.enc(x).mean(1))


class LSTMClassifier(nn.Module):
    def __init__(self, features=40, hidden=128, classes=10):
        super().__init__()
        self.lstm, self.head = nn.LSTM(features, hidden, batch_first=True), nn.Linear(hidden, classes)

    def forward(self, x):
        return self.head(self.lstm(x)[0][:, -1])


class ConformerBlock(nn.Module):
    """Conformer-style audio classifier: conv subsampling of mel frames, then a block of
    half-step FFN, self-attention, a depthwise-conv module (GLU, BatchNorm, SiLU), FFN, LayerNorm."""

    def __init__(self, mels=40, d=96, classes=12):
        super().__init__()
        self.sub = nn.Sequential(nn.Conv1d(mels, d, 3, stride=2, padding=1), nn.SiLU())
        self.ff1 = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d))
        self.norm_att, self.att = nn.LayerNorm(d), nn.MultiheadAttention(d, 4, batch_first=True)
        self.norm_conv, self.pw1 = nn.LayerNorm(d), nn.Conv1d(d, 2 * d, 1)
        self.dw, self.bn, self.pw2 = nn.Conv1d(d, d, 15, padding=7, groups=d), nn.BatchNorm1d(d), nn.Conv1d(d, d, 1)
        self.ff2 = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d))
        self.out, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

    def forward(self, mel):  # [B, mels, T]
        x = self.sub(mel).transpose(1, 2)
        x = x + 0.5 * self.ff1(x)
        a = self.norm_att(x)
        x = x + self.att(a, a, a, need_weights=False)[0]
        c = nn.functional.glu(self.pw1(self.norm_conv(x).transpose(1, 2)), dim=1)
        x = x + self.pw2(nn.functional.silu(self.bn(self.dw(c)))).transpose(1, 2)
        x = self.out(x + 0.5 * self.ff2(x))
        return self.head(x.mean(1))


def _random_case(module: nn.Module, shape: tuple[int, ...], seed: int = 0) -> Case:
    g = np.random.default_rng(seed)
    rows = g.standard_normal((CALIB_ROWS + EVAL_ROWS, *shape[1:])).astype(np.float32)
    return Case(module.eval(), [r[None].copy() for r in rows[:CALIB_ROWS]], rows[CALIB_ROWS:])


def _zoo_case(name: str, size: str) -> Case:
    built = zoo.build(name, size)
    rows = built.sample_batch(CALIB_ROWS + EVAL_ROWS)[0].numpy()
    return Case(built.module.eval(), [r[None].copy() for r in rows[:CALIB_ROWS]], rows[CALIB_ROWS:])


def _digits() -> Case:
    tr = trained_models.digits()
    return Case(tr.module.eval(), [r[None].copy() for r in tr.calib[:CALIB_ROWS]], tr.eval_x[:200], tr.eval_y[:200])


CASES = {
    "digits CNN (trained)": _digits,
    "MobileNetV2 128 (zoo bench size)": lambda: _zoo_case("mobilenet_v2", "bench"),
    "ViT tiny (zoo)": lambda: _zoo_case("vit", "tiny"),
    "transformer encoder 4x128, T 64": lambda: _random_case(Encoder(), (1, 64, 128)),
    "LSTM hidden 128, T 50": lambda: _random_case(LSTMClassifier(), (1, 50, 40)),
    "conformer block 96, T 100": lambda: _random_case(ConformerBlock(), (1, 40, 100)),
}
SHORT = {"cnn": "digits CNN (trained)", "mobilenet": "MobileNetV2 128 (zoo bench size)", "vit": "ViT tiny (zoo)",
         "encoder": "transformer encoder 4x128, T 64", "lstm": "LSTM hidden 128, T 50",
         "conformer": "conformer block 96, T 100"}


class ExecuTorch:
    """bench/executorch_side.py in .venv-executorch, one JSON line each way."""

    def __init__(self):
        self._start()

    def _start(self) -> None:
        self.p = subprocess.Popen([str(ET_PYTHON), str(ROOT / "bench" / "executorch_side.py")], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)

    def ask(self, **req) -> dict:
        """The answer, or {"error"} when the child died on this request (it is started again)."""
        try:
            self.p.stdin.write(json.dumps(req) + "\n")
            self.p.stdin.flush()
            for line in self.p.stdout:
                if line.startswith("{"):
                    return json.loads(line)
        except BrokenPipeError:
            pass
        code = self.p.wait()
        self._start()
        return {"error": f"ExecuTorch's process ended (exit {code}) on {req['cmd']}"}

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait(timeout=60)


def _cosine(ref: np.ndarray, got: np.ndarray) -> float:
    a, b = ref.reshape(len(ref), -1).astype(np.float64), got.reshape(len(got), -1).astype(np.float64)
    return float(np.mean((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-30)))


def measure(name: str, case: Case, et: ExecuTorch, work: Path, rounds: int, runs: int) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        ref = case.module(torch.from_numpy(case.eval_x)).numpy()
    kw = {}
    if case.labels is not None:
        np.savez(work / "eval.npz", x=case.eval_x, labels=case.labels)
        kw["eval_data"] = work / "eval.npz"
    t = time.perf_counter()
    r = tc.convert(case.module, (torch.tensor(case.calib[0]),), targets="desktop,android", out=work / "dist",
                   calibration=[(torch.tensor(c),) for c in case.calib], **kw)
    convert_s = time.perf_counter() - t
    android, desktop = r["android"], r["desktop"]
    ours = {"float32": desktop.artifact.model, f"android: {android.precision}": android.artifact.model}
    ep = torch.export.export(case.module, (torch.tensor(case.calib[0]),))
    torch.export.save(ep, work / "model.pt2")
    np.savez(work / "calib.npz", in0=np.concatenate(case.calib))
    np.savez(work / "eval_rows.npz", in0=case.eval_x)
    np.savez(work / "row.npz", in0=case.eval_x[:1])
    low = et.ask(cmd="lower", pt2=str(work / "model.pt2"), calib=str(work / "calib.npz"), out=str(work))
    progs: dict[str, dict] = {}
    for label, model in ours.items():
        runner = LitertRunner(model, inspect_model(model))
        got = np.concatenate([runner.run([x[None]])[0] for x in case.eval_x])
        progs[label] = {"tool": "tpu-pipeline", "bytes": len(model), "cos": _cosine(ref, got), "model": model,
                        "acc": None if case.labels is None else float((got.argmax(-1) == case.labels).mean())}
    for kind in ("fp32", "int8"):
        info = low.get(kind) if "error" not in low else None
        if info is None:
            progs[f"ExecuTorch {kind}"] = {"tool": "ExecuTorch", "error": low.get("error")}
            continue
        out = et.ask(cmd="run", pte=info["pte"], rows=str(work / "eval_rows.npz"), out=str(work / f"et_{kind}.npy"))
        got = np.load(out["out"]) if "out" in out else None
        progs[f"ExecuTorch {kind}"] = {
            "tool": "ExecuTorch", "bytes": info["bytes"], "pte": info["pte"], "lower_s": info["lower_s"],
            "partitions": info["partitions"], "other_nodes": info["other_nodes"],
            "cos": None if got is None else _cosine(ref, got),
            "acc": None if case.labels is None or got is None else float((got.argmax(-1) == case.labels).mean())}
    for threads in (1, 2):
        per: dict[str, list[float]] = {k: [] for k, p in progs.items() if "error" not in p}
        for _ in range(rounds):
            for label, p in progs.items():
                if "error" in p:
                    continue
                if p["tool"] == "ExecuTorch":
                    ms = et.ask(cmd="time", pte=p["pte"], rows=str(work / "row.npz"), threads=threads,
                                runs=runs).get("ms")
                    if ms is None:
                        continue
                else:
                    ms = _timed(p["model"], case.eval_x[:1], threads, runs)
                per[label].append(ms)
        for label, ms in per.items():
            progs[label][f"ms_{threads}t"] = float(np.median(ms)) if ms else float("nan")
    return {"model": name, "android_ships": android.precision, "chosen_because": android.chosen_because,
            "android_candidates": android.candidates, "android_xnnpack": android.xnnpack, "convert_s": convert_s,
            "programs": {k: {kk: vv for kk, vv in p.items() if kk != "model"} for k, p in progs.items()}}


def _timed(model: bytes, row: np.ndarray, threads: int, runs: int) -> float:
    """Median ms of one call with its I/O (set the input, invoke, read the output), as ExecuTorch's
    `execute` takes inputs and hands back outputs."""
    runner = LitertRunner(model, inspect_model(model), threads=threads)
    runner.run([row])
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        runner.run([row])
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)


def table(results: list[dict]) -> str:
    lines = ["| model | program | ms 1 thread | ms 2 threads | / ET int8 (1 t) | bytes | cosine vs PyTorch | "
             "accuracy | convert / lower s | XNNPACK partitions |", "|---|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        et8 = res["programs"].get("ExecuTorch int8", {}).get("ms_1t")
        for label, p in res["programs"].items():
            if "error" in p:
                lines.append(f"| {res['model']} | {label} | failed: {p['error']} | | | | | | | |")
                continue
            ratio = f"{p['ms_1t'] / et8:.2f}x" if et8 else ""
            secs = res["convert_s"] if p["tool"] == "tpu-pipeline" else p["lower_s"]
            parts = p.get("partitions", res["android_xnnpack"]["partitions"] if label.startswith("android") and
                          res["android_xnnpack"] else "")
            acc = f"{p['acc']:.3f}" if p.get("acc") is not None else ""
            cos = f"{p['cos']:.5f}" if p.get("cos") is not None else "run failed"
            lines.append(f"| {res['model']} | {label} | {p['ms_1t']:.4g} | {p['ms_2t']:.4g} | {ratio} | {p['bytes']} | "
                         f"{cos} | {acc} | {secs:.1f} | {parts} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help=f"comma-separated: {', '.join(SHORT)}")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--table-from", type=Path, help="print the table of a --json file written before, measure nothing")
    a = ap.parse_args()
    if a.table_from:
        print(table(json.loads(a.table_from.read_text())))
        return
    if not ET_PYTHON.exists():
        sys.exit("no .venv-executorch: run `make .venv-executorch/.installed` (or `make bench-executorch`)")
    names = [SHORT[s] for s in a.only.split(",") if s] or list(CASES)
    torch.manual_seed(0)
    et = ExecuTorch()
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="vs-executorch-") as tmp:
            for i, name in enumerate(names):
                print(f"# {name}", file=sys.stderr, flush=True)
                results.append(measure(name, CASES[name](), et, Path(tmp) / str(i), a.rounds, a.runs))
                if a.json:  # as each model ends: a later failure keeps the figures measured so far
                    a.json.write_text(json.dumps(results, indent=1, default=str))
    finally:
        et.close()
    print(f"Machine: {platform.processor() or platform.machine()}, {platform.platform()}; "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; torch {torch.__version__}; "
          f"command: .venv/bin/python bench/vs_executorch.py {' '.join(sys.argv[1:])}\n")
    print(table(results))
    for res in results:
        print(f"\n{res['model']}: android ships {res['android_ships']} ({res['chosen_because']})")
    if a.json:
        a.json.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
