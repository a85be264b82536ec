"""Benchmark for `tpu-pipeline convert`: three model families, one run.

For each model (three families; the CNN also at a microcontroller size): wall time of convert --targets all (library call, five targets
with compatibility checks and parity) against one bare
`litert_torch.convert(model, args).export(path)` of the same model, measured
in the same process after a warm-up conversion (imports and torch.export's
first-call costs paid once for both). Per target: artifact size, parity figures
and median latency on ai-edge-litert against torch eager on the same input.

CPU command (about 10 minutes on 2 shared cores with --repeats 3):
    nice -n 5 .venv/bin/python bench/convert.py --out runs/bench_convert --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import litert_torch
import torch

import tpu_pipeline.convert as convert_pkg
from tpu_pipeline.convert import convert
from tpu_pipeline.convert.tool_output import quiet_native
from tpu_pipeline.testing import reference_models as R

MODELS = {  # family -> (class, kwargs)
    "depthwise_cnn": ("DepthwiseCNN", {"in_channels": 3, "size": 64, "width": 32, "blocks": 4, "classes": 100}),
    # MCU-sized: its activations fit the iot profile's 256 KiB arena, so TFLM parity has figures.
    "depthwise_cnn_mcu": ("DepthwiseCNN", {"in_channels": 1, "size": 32, "width": 16, "blocks": 2, "classes": 10}),
    "transformer_encoder": ("TinyEncoder", {"vocab": 1000, "seq": 64, "dim": 128, "heads": 4, "layers": 4, "classes": 10}),
    "decoder_lm": ("TinyDecoderLM", {"vocab": 1000, "seq": 64, "dim": 128, "heads": 4, "layers": 4}),
}


def manifest(cls: str, kwargs: dict, path: Path, task: str) -> Path:
    torch.manual_seed(0)
    m = getattr(R, cls)(**kwargs).eval()
    torch.save({"format": "tpu-pipeline/model@1", "model_class": f"tpu_pipeline.testing.reference_models:{cls}",
                "model_kwargs": kwargs, "state_dict": m.state_dict(), "example_inputs": list(m.example_inputs()),
                "input_names": ["x"], "output_names": ["logits"], "task": task, "recipe": "bench", "metrics": {}}, path)
    return path


def bare(cls: str, kwargs: dict, path: Path) -> float:
    torch.manual_seed(0)
    m = getattr(R, cls)(**kwargs).eval()
    args = m.example_inputs()
    t = time.perf_counter()
    with quiet_native():
        litert_torch.convert(m, args).export(str(path))
    return time.perf_counter() - t


def _single_precision_profiles(folder: Path) -> Path:
    """The shipped profiles without their `precisions` lists: each target builds its one `precision`."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in (Path(convert_pkg.__file__).parent / "targets").glob("*.toml"):
        lines = [ln for ln in f.read_text().splitlines() if not ln.startswith("precisions ")]
        (folder / f.name).write_text("\n".join(lines) + "\n")
    return folder


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="runs/bench_convert")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--samples", type=int, default=None, help="parity rows (default: the tool's own)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of " + ", ".join(MODELS))
    ap.add_argument("--single-precision", action="store_true",
                    help="also time each convert with one precision per target (profiles without `precisions`): "
                         "the cost of measuring candidates")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-convert-"))
    bare("DepthwiseCNN", {}, work / "warmup.tflite")  # first-call costs, paid for both sides
    results = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                           "torch_threads": torch.get_num_threads()},
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "models": {}}
    single = _single_precision_profiles(work / "profiles") if a.single_precision else None
    for family in a.models.split(","):
        cls, kwargs = MODELS[family]
        task = "causal-lm" if family == "decoder_lm" else "classification"
        model = manifest(cls, kwargs, work / f"{family}.pt", task)
        bare_s, full_s, report = [], [], None
        for _ in range(a.repeats):
            bare_s.append(bare(cls, kwargs, work / f"{family}.tflite"))
            t = time.perf_counter()
            report = convert(model, out=out / family, samples=a.samples).report  # a failing target is a result
            full_s.append(time.perf_counter() - t)
        row = {"bare_convert_export_s": statistics.median(bare_s), "convert_all_targets_s": statistics.median(full_s),
               "export_inside_convert_s": report["export_s"], "targets": {}}
        row["ratio"] = row["convert_all_targets_s"] / row["bare_convert_export_s"]
        if single is not None:
            one_s = []
            for _ in range(a.repeats):
                t = time.perf_counter()
                convert(model, out=work / "single" / family, samples=a.samples, profile_dir=single)
                one_s.append(time.perf_counter() - t)
            row["convert_one_precision_s"] = statistics.median(one_s)
            row["ratio_one_precision"] = row["convert_one_precision_s"] / row["bare_convert_export_s"]
        for name, t in report["targets"].items():
            p, lat = t.get("parity") or {}, t.get("latency_ms") or {}
            row["targets"][name] = {
                "passed": t["passed"], "quantization": t["quantization"], "size_bytes": t["size_bytes"],
                "cosine": p.get("cosine"), "max_abs": p.get("max_abs"), "snr_db": p.get("snr_db"), "top1": p.get("top1"),
                "latency_ms": lat.get("artifact"), "torch_eager_ms": lat.get("torch_eager"),
                "speedup_vs_torch": lat.get("speedup_vs_torch"), "errors": t["errors"][:1]}
        results["models"][family] = row
        print(json.dumps({family: {k: v for k, v in row.items() if k != "targets"}}), flush=True)
    (out / "bench.json").write_text(json.dumps(results, indent=2))
    print(markdown(results))


def markdown(res: dict) -> str:
    lines = ["| model | bare convert+export (s) | convert, 5 targets + parity (s) | ratio | one precision per target (s) | ratio |",
             "|---|---|---|---|---|---|"]
    for fam, r in res["models"].items():
        one = (f"{r['convert_one_precision_s']:.1f} | {r['ratio_one_precision']:.2f}x" if "convert_one_precision_s" in r
               else "- | -")
        lines.append(f"| {fam} | {r['bare_convert_export_s']:.1f} | {r['convert_all_targets_s']:.1f} | {r['ratio']:.2f}x | {one} |")
    lines += ["", "| model | target | quantization | bytes | cosine | max_abs | SNR dB | top-1 | artifact ms | torch ms | speed-up | status |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda v, fmt: format(v, fmt) if isinstance(v, (int, float)) else "-"  # noqa: E731
    for fam, r in res["models"].items():
        for tn, t in r["targets"].items():
            status = "pass" if t["passed"] else "FAIL: " + (t["errors"][0][:90] if t["errors"] else "")
            lines.append(f"| {fam} | {tn} | {t['quantization']} | {t['size_bytes']} | {f(t['cosine'], '.6f')} | "
                         f"{f(t['max_abs'], '.2g')} | {f(t['snr_db'], '.1f')} | {f(t['top1'], '.3f')} | "
                         f"{f(t['latency_ms'], '.3f')} | {f(t['torch_eager_ms'], '.3f')} | {f(t['speedup_vs_torch'], '.1f')}x | {status} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
