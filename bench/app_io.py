"""Apps' side of the boundary (issue 38): an image, an audio and a text classifier trained for
seconds (tpu_pipeline.testing.app_models), converted with an input description and labels, and
scored on their held-out rows by PyTorch, by the artifact on ai-edge-litert, through MediaPipe
Tasks in Python (the C++ task graphs) and MediaPipe Tasks for the web in headless Chromium; then
bytes and latency with and without what app_io adds (NHWC transpose and softmax in the graph,
TFLite metadata) and with the client's own preprocessing.

    .venv/bin/python bench/app_io.py --out /tmp/app_io_bench

Prints one Markdown table per measurement (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import litert_torch
import numpy as np
import torch

import tpu_pipeline.convert as tc
from tpu_pipeline.convert.app_io.graph import AppGraph
from tpu_pipeline.convert.app_io.worker import call
from tpu_pipeline.convert.runtimes.litert import LitertRunner
from tpu_pipeline.convert.tflite_info import inspect_model
from tpu_pipeline.convert.tool_output import quiet_native
from tpu_pipeline.testing import app_models
from tpu_pipeline.testing.mediapipe_web import classify_in_chromium

TASKS = {"colours": ("image", "ImageClassifier"), "tones": ("audio", "AudioClassifier"),
         "sentiment": ("text", "TextClassifier")}


def _export(module: torch.nn.Module, args, path: Path) -> bytes:
    with quiet_native():
        litert_torch.convert(module.eval(), args).export(str(path))
    return path.read_bytes()


def _accuracy(scores: np.ndarray, y: np.ndarray) -> float:
    return float((np.asarray(scores).argmax(1) == y).mean())


def _raw(am, kind: str):
    if kind == "image":
        return [{"rgba": np.concatenate([p, np.full(p.shape[:2] + (1,), 255, np.uint8)], -1).ravel().tolist(),
                 "width": p.shape[1], "height": p.shape[0]} for p in am.raw]
    return [w.tolist() for w in am.raw] if kind == "audio" else list(am.raw)


def measure(name: str, work: Path) -> dict:
    kind, task = TASKS[name]
    am = getattr(app_models, name)(n_eval=256)
    work.mkdir(parents=True, exist_ok=True)
    np.savez(work / "eval.npz", x=am.eval_x, labels=am.eval_y)
    (work / "labels.txt").write_text("\n".join(am.labels) + "\n")
    flag = am.flag.replace("VOCAB", str(app_models.write_vocab(work / "vocab.txt")))
    r = tc.convert(am.module, (am.example(),), targets="desktop,android,web", out=work / "dist",
                   eval_data=str(work / "eval.npz"), labels=str(work / "labels.txt"), progress=False,
                   **{kind: flag})
    row = {"model": name, "task": task, "rows": len(am.eval_y),
           "torch": app_models.accuracy(am.module, am.eval_x, am.eval_y)}
    for target in ("desktop", "android", "web"):
        t = r[target]
        assert t.passed, (target, t.errors)
        row[f"{target}_precision"] = t.quantization
        row[f"{target}_litert"] = t.parity["task_score"]["score"]
        row[f"{target}_mediapipe"] = t.parity["app"]["client"]["task_score"]["score"]
    web = classify_in_chromium(work / "dist" / "web", f"model_{task}.js", task, kind, _raw(am, kind))
    row["web_mediapipe_js"] = float(np.mean([c[0][0] == y for c, y in zip(web, am.eval_y)]))
    # bytes and latency: the model as exported today (PyTorch's layout, logits) against the app graph
    # (NHWC input, softmax head) and the app graph with its metadata (labels, normalisation, tokenizer)
    desk = r["desktop"]
    plain = _export(am.module, (am.example(),), work / "plain.tflite")
    app_graph = _export(AppGraph(am.module, 0 if kind == "image" else None, True),
                        (torch.from_numpy(desk_rows(am, kind)[0][0]),), work / "app_graph.tflite")
    shipped = Path(desk.artifact_path).read_bytes()
    row.update(bytes_plain=len(plain), bytes_app_graph=len(app_graph), bytes_shipped=len(shipped))
    sample_plain = [am.eval_x[:1]]
    sample_app = desk_rows(am, kind)[0]
    lat_plain = LitertRunner(plain, inspect_model(plain), threads=1).latency_ms(sample_plain)
    lat_app = LitertRunner(shipped, inspect_model(shipped), threads=1).latency_ms(sample_app)
    np.savez(work / "raw.npz", **({"pixels": np.stack(am.raw)} if kind == "image" else
                                  {"waveforms": np.stack(am.raw)} if kind == "audio" else {}))
    ans = call({"op": "classify", "task": kind, "model": desk.artifact_path, "rows": str(work / "raw.npz"),
                "out": str(work / "scores.npz"), "texts": list(am.raw) if kind == "text" else [],
                "rate": app_models.RATE}, "bench")
    row.update(ms_litert_plain=lat_plain, ms_litert_app=lat_app, ms_mediapipe_call=ans["ms_per_call"])
    return row


def desk_rows(am, kind: str) -> list[list[np.ndarray]]:
    """The eval rows in the app graph's input space (an image NHWC)."""
    x = am.eval_x.transpose(0, 2, 3, 1) if kind == "image" else am.eval_x
    return [[np.ascontiguousarray(x[i:i + 1])] for i in range(len(x))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("/tmp/app_io_bench"))
    args = ap.parse_args()
    rows = [measure(name, args.out / name) for name in TASKS]
    print("| model | MediaPipe task | rows | PyTorch | desktop: ai-edge-litert / MediaPipe | android: litert / "
          "MediaPipe | web: litert / MediaPipe (Python) / MediaPipe (Chromium) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['task']} | {r['rows']} | {r['torch']:.4f} | {r['desktop_litert']:.4f} / "
              f"{r['desktop_mediapipe']:.4f} ({r['desktop_precision']}) | {r['android_litert']:.4f} / "
              f"{r['android_mediapipe']:.4f} ({r['android_precision']}) | {r['web_litert']:.4f} / "
              f"{r['web_mediapipe']:.4f} / {r['web_mediapipe_js']:.4f} ({r['web_precision']}) |")
    print()
    print("| model | bytes: plain export | + NHWC, softmax | + metadata (desktop, shipped) | ms: plain on "
          "ai-edge-litert | shipped on ai-edge-litert | MediaPipe classify (its preprocessing + model) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['bytes_plain']} | {r['bytes_app_graph']} ({r['bytes_app_graph'] / r['bytes_plain']:.3f}x)"
              f" | {r['bytes_shipped']} ({r['bytes_shipped'] / r['bytes_plain']:.3f}x) | {r['ms_litert_plain']:.4f} | "
              f"{r['ms_litert_app']:.4f} ({r['ms_litert_app'] / r['ms_litert_plain']:.2f}x) | "
              f"{r['ms_mediapipe_call']:.4f} ({r['ms_mediapipe_call'] / r['ms_litert_plain']:.1f}x) |")
    print(f"\nmedian of the MediaPipe ratios: {statistics.median(r['ms_mediapipe_call'] / r['ms_litert_plain'] for r in rows):.1f}x")


if __name__ == "__main__":
    main()
