"""Hugging Face task folders converted by the folder alone (issue 39): per folder and target, the
shipped precision, the task score on the artifact's runtime against PyTorch's through the same
processor, and the whole convert's wall time against a bare litert-torch export of the same model.

Folders: tiny ViT, BERT (sequence, token), DistilBERT and ALBERT (sequence), Wav2Vec2, AST and Whisper (audio on
spectrogram features computed outside the artifact), Segformer and DETR trained here for seconds
(tpu_pipeline.testing.hf_task_folders), saved with save_pretrained beside their processors; raw
eval data and a separate raw calibration set of the same kind (image folders, CSV/JSONL text, wav
folder with labels.csv, images/ + masks/, images + boxes.csv). The bare export is `litert_torch.convert(module,
sample_args).export(path)` of the HF model with its outputs as a tuple on the processor's example
row (no parity, no variants, no checks): what a user scripting litert-torch would write first.
Where the folder has an app description, the MediaPipe client's task score per target (Python
Tasks; on web also Tasks for the web in Chromium) and, for a text classifier, bytes: the bare
export, the app graph (int32 inputs cast inside, softmax head) exported the same way, and the
shipped desktop artifact (float32, the app graph plus its metadata and packed vocab and labels).

CPU command (about 10 minutes on 2 shared cores; --models bert_seq about 1 minute):
    nice -n 5 .venv/bin/python bench/hf_tasks.py --out runs/bench_hf_tasks
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tpu_pipeline.convert import convert
from tpu_pipeline.convert.hf.folder import open_folder
from tpu_pipeline.convert.hf.kind import _model
from tpu_pipeline.convert.hf.families import family_for
from tpu_pipeline.testing import hf_task_folders as hf

CASES = {  # builder, raw eval data, raw calibration data (other rows)
    "vit": (hf.save_vit, lambda d: hf.image_folder(d / "eval", 48), lambda d: hf.image_folder(d / "calib", 24, seed=7)),
    "bert_seq": (hf.save_bert_seq, lambda d: hf.sentiment_csv(d / "eval.csv", 48),
                 lambda d: hf.sentiment_csv(d / "calib.csv", 24, seed=7)),
    "distilbert_seq": (hf.save_distilbert_seq, lambda d: hf.sentiment_csv(d / "eval.csv", 48),
                       lambda d: hf.sentiment_csv(d / "calib.csv", 24, seed=7)),
    "albert_seq": (hf.save_albert_seq, lambda d: hf.sentiment_csv(d / "eval.csv", 48),
                   lambda d: hf.sentiment_csv(d / "calib.csv", 24, seed=7)),
    "bert_tok": (hf.save_bert_tok, lambda d: hf.entity_jsonl(d / "eval.jsonl", 48),
                 lambda d: hf.entity_jsonl(d / "calib.jsonl", 24, seed=7)),
    "wav2vec2": (hf.save_wav2vec2, lambda d: hf.wav_folder(d / "eval", 32),
                 lambda d: hf.wav_folder(d / "calib", 16, seed=7)),
    "ast": (hf.save_ast, lambda d: hf.wav_folder(d / "eval", 32), lambda d: hf.wav_folder(d / "calib", 16, seed=7)),
    "whisper": (hf.save_whisper, lambda d: hf.wav_folder(d / "eval", 32),
                lambda d: hf.wav_folder(d / "calib", 16, seed=7)),
    "segformer": (hf.save_segformer, lambda d: hf.mask_folder(d / "eval", 32),
                  lambda d: hf.mask_folder(d / "calib", 16, seed=7)),
    "detr": (hf.save_detr, lambda d: hf.box_folder(d / "eval", 32), lambda d: hf.box_folder(d / "calib", 16, seed=7)),
}


def bare_export_s(folder: Path, work: Path) -> float:
    import litert_torch

    f = open_folder(folder)
    fam = family_for(f.architecture).open(f, _model(f), None)
    t = time.perf_counter()
    litert_torch.convert(fam.module().eval(), fam.sample_args).export(str(work / "bare.tflite"))
    return time.perf_counter() - t


def app_graph_bytes(folder: Path, work: Path) -> int | None:
    """A text classifier's app graph (what app_io wraps the model in, before metadata) exported bare."""
    import litert_torch
    import torch

    from tpu_pipeline.convert.app_io.graph import AppGraph

    f = open_folder(folder)
    fam = family_for(f.architecture).open(f, _model(f), None)
    text = fam.app_io().get("text")
    if text is None:
        return None
    graph = AppGraph(fam.module().eval(), None, True, tuple(range(len(text.names))), "int64")
    litert_torch.convert(graph, tuple(a.to(torch.int32) for a in fam.sample_args)).export(str(work / "app.tflite"))
    return (work / "app.tflite").stat().st_size


def warm_up(work: Path) -> None:
    """litert-torch's first export in a process pays its start-up (seconds): paid here, outside both timings."""
    import litert_torch
    import torch

    litert_torch.convert(torch.nn.Linear(4, 2).eval(), (torch.zeros(1, 4),)).export(str(work / "warm.tflite"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--targets", default="desktop,android,ios,web")
    ap.add_argument("--models", default=",".join(CASES))
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    warm_up(a.out)
    for name in a.models.split(","):
        save, ev, cal = CASES[name]
        d = a.out / name
        folder, eval_data, calib = save(d / "folder"), ev(d), cal(d)
        bare = bare_export_s(folder, d)
        t = time.perf_counter()
        r = convert(folder, targets=a.targets, out=d / "dist", eval_data=eval_data, calibration=calib, latency=False)
        wall = time.perf_counter() - t
        rep = r.report
        app_bytes = app_graph_bytes(folder, d)
        for target, res in rep["targets"].items():
            ts = (res.get("parity") or {}).get("task_score") or {}
            client = ((res.get("parity") or {}).get("app") or {}).get("client") or {}
            rows.append({"model": name, "task": rep["task"], "target": target, "precision": res.get("quantization"),
                         "passed": res.get("passed"), "metric": ts.get("metric"), "rows": ts.get("rows"),
                         "torch": ts.get("torch_score"), "artifact": ts.get("score"), "drop": ts.get("drop"),
                         "app_client": client.get("passed"),
                         "mediapipe": (client.get("task_score") or {}).get("score"),
                         "mediapipe_web": ((client.get("web") or {}).get("task_score") or {}).get("score"),
                         "mediapipe_vs_litert_max_abs": (client.get("vs_runtime_same_raw") or {}).get("max_abs"),
                         "bytes_shipped": res.get("size_bytes"), "bytes_bare": (d / "bare.tflite").stat().st_size,
                         "bytes_app_graph": app_bytes,
                         "convert_s": wall, "export_s": rep.get("export_s"), "bare_export_s": bare})
            print(json.dumps(rows[-1]), flush=True)
    (a.out / "results.json").write_text(json.dumps(rows, indent=1))
    print("| model | target | shipped | passed | metric (rows) | PyTorch | artifact | MediaPipe check | convert s | "
          "bare export s | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for x in rows:
        fmt = (lambda v: "n/a" if v is None else f"{v:.4f}")
        print(f"| {x['model']} | {x['target']} | {x['precision']} | {'yes' if x['passed'] else 'NO'} | "
              f"{x['metric']} ({x['rows']}) | {fmt(x['torch'])} | "
              f"{fmt(x['artifact'])} | {'-' if x['app_client'] is None else ('pass' if x['app_client'] else 'FAIL')} | "
              f"{x['convert_s']:.1f} | {x['bare_export_s']:.1f} | {x['convert_s'] / x['bare_export_s']:.1f}x |")
    print("\n| model | target | PyTorch | ai-edge-litert | MediaPipe (Python) | MediaPipe (Chromium) | "
          "max abs vs litert | bytes bare / app graph / shipped |")
    print("|---|---|---|---|---|---|---|---|")
    for x in rows:
        if x["app_client"] is None:
            continue
        fmt = (lambda v: "-" if v is None else f"{v:.4f}")
        print(f"| {x['model']} | {x['target']} | {fmt(x['torch'])} | {fmt(x['artifact'])} | {fmt(x['mediapipe'])} | "
              f"{fmt(x['mediapipe_web'])} | {x['mediapipe_vs_litert_max_abs']:.2g} | {x['bytes_bare']} / "
              f"{x['bytes_app_graph'] or '-'} / {x['bytes_shipped']} |")


if __name__ == "__main__":
    main()
