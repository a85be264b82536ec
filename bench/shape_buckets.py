"""Shape buckets (convert/shapes.py, issue 32): three models whose inputs vary, each converted
with a signature (or file) per bucket and once at its largest bucket alone.

    .venv/bin/python bench/shape_buckets.py [--only gru,text,conv] [--targets desktop,android,web,iot]
    .venv/bin/python bench/shape_buckets.py --only text,conv --targets android-npu   # needs the [npu] extra

Models (tests/support/shape_models.py): a GRU keyword spotter over raw audio of 4000..16000
samples (--dynamic, powers of two, a length input), a masked text CNN over 16..64 token ids
(--shapes, a mask input), a conv net at 32x32 and 64x64 (--shapes, --pad none). Per model and
target: artifact bytes with N buckets against the largest bucket alone at the precision the
target shipped (the file, and the weights alone: the flatbuffer's constant buffers), convert
wall seconds N buckets vs one conversion at the largest bucket (same targets), and per bucket
the latency of its signature on ai-edge-litert (XNNPACK, one thread) beside PyTorch eager at that
shape (one thread), with the bucket's parity (cosine, worst row); for android-npu, each bucket's
compile per SoC (ops on the NPU, bytes, compile seconds, the HTP simulator's verdict and time per
row). Prints markdown tables with the machine and date (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import tempfile
import time
from pathlib import Path

import torch
from ai_edge_litert.tools import flatbuffer_utils

import tpu_pipeline.convert as tc
from tpu_pipeline.convert.module.buckets import export_signatures
from tpu_pipeline.convert.module.loaders import load_object
from tpu_pipeline.convert.precision.quantize import quantize
from tpu_pipeline.testing.shape_models import GRUKeyword, MaskedTextCNN, TwoResolutionCNN

SAMPLES = 16  # parity rows per bucket


def models() -> dict:
    torch.manual_seed(0)
    return {
        "gru": ("GRU keyword spotter, audio 4000..16000 samples", GRUKeyword().eval(), GRUKeyword().example_inputs,
                {"dynamic": ("audio:1=4000..16000",), "pad": ("audio=length:length",)}, (16000,)),
        "text": ("masked text CNN, 16..64 token ids", MaskedTextCNN().eval(), MaskedTextCNN().example_inputs,
                 {"shapes": ("ids=1x16,1x32,1x64", "mask=1x16,1x32,1x64"), "pad": ("ids=mask:mask",)}, (64,)),
        "conv": ("conv net at 32x32 and 64x64", TwoResolutionCNN().eval(), TwoResolutionCNN().example_inputs,
                 {"shapes": ("x=1x3x32x32,1x3x64x64",), "pad": ("x=none",)}, ((64, 64),)),
    }


def weight_bytes(model: bytes) -> int:
    obj = flatbuffer_utils.read_model_from_bytearray(bytearray(model))
    return sum(len(b.data) for b in obj.buffers if b.data is not None)


def shipped_bytes(folder: Path) -> tuple[int, int]:
    tfl = sorted(folder.glob("*.tflite"))
    data = [p.read_bytes() for p in tfl]
    return sum(map(len, data)), sum(weight_bytes(d) for d in data)


def one_bucket(net, args, precision: str, folder: Path, layout: str, path: Path) -> bytes:
    """The largest bucket alone at the precision the target shipped: for a file per bucket, that
    bucket's own file; for signatures, the same export and variant with one signature."""
    if layout == "files":
        return max((p.read_bytes() for p in folder.glob("model_*.tflite")), key=len)
    return quantize(export_signatures([("one", load_object(net, args))], path), precision)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="gru,text,conv")
    ap.add_argument("--targets", default="desktop,android,web,iot")
    a = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}; "
          f"torch {torch.__version__}; {datetime.date.today()}")
    print(f"command: .venv/bin/python bench/shape_buckets.py --only {a.only} --targets {a.targets}\n")
    table_bytes, table_lat, table_npu = [], [], []
    for key in a.only.split(","):
        title, net, example, kw, largest = models()[key]
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            t = time.perf_counter()
            res = tc.convert(net, example(), targets=a.targets, out=tmp / "n", samples=SAMPLES, **kw)
            n_s = time.perf_counter() - t
            t = time.perf_counter()
            one = tc.convert(net, example(*largest), targets=a.targets, out=tmp / "one", samples=SAMPLES)
            one_s = time.perf_counter() - t
            for name, r in res.targets.items():
                folder = tmp / "n" / name / ("" if r.passed else "failed")
                nb, nw = shipped_bytes(folder)
                layout = "signatures" if (folder / "model.tflite").exists() else "files"
                single = one_bucket(net, example(*largest), r.quantization, folder, layout, tmp / f"one_{name}.tflite")
                ob, ow = len(single), weight_bytes(single)
                fails = [b["name"] for b in r.buckets if not b["passed"]]
                table_bytes.append(
                    f"| {title} | {name} | {r.quantization} | {len(r.buckets)} {layout} | "
                    f"{'pass' if r.passed else 'FAIL: ' + ', '.join(fails) + ' (' + (r.errors[0][:80] if r.errors else '') + ')'}"
                    f" | {nb} / {ob} = {nb / ob if ob else float('nan'):.3f}x | {nw} / {ow} = "
                    f"{nw / ow if ow else float('nan'):.3f}x | {n_s:.1f} / {one_s:.1f} s |")
                for bucket, f in ((r.npu or {}).get("buckets") or {}).items():  # android-npu: a compile per bucket and SoC
                    for soc, g in f.get("socs", {}).items():
                        sim = g.get("simulator") or {}
                        cos = min((m.get("cosine_mean", m.get("cosine")) for m in (sim.get("vs_pytorch") or {}).values()),
                                  default=float("nan"))
                        table_npu.append(f"| {title} | {bucket} | {soc} | {r.quantization} | {g.get('ops_on_npu')}/"
                                         f"{g.get('ops_total')} | {g.get('size_bytes')} | {g.get('compile_s', float('nan')):.2f} | "
                                         f"{'pass' if sim.get('passed') else 'FAIL'} on {sim.get('rows')} rows, "
                                         f"{sim.get('s_per_row', float('nan')):.3f} s/row | {cos:.6f} |")
                for b in r.buckets:
                    lat, p = b.get("latency_ms") or {}, b.get("parity") or {}
                    if lat.get("artifact") is None:
                        continue
                    table_lat.append(f"| {title} | {name} | {b['name']} | {b['quantization']} | {lat['artifact']:.3f} | "
                                     f"{lat['torch_eager']:.3f} | {lat['torch_eager'] / lat['artifact']:.1f}x | "
                                     f"{p.get('cosine', float('nan')):.6f} |")
    print("| model | target | precision | buckets | verdict | bytes N / 1 | weight bytes N / 1 | convert N / 1 |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(table_bytes))
    print("\n| model | target | bucket | precision | ai-edge-litert ms | PyTorch eager ms | speedup | cosine (worst row) |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(table_lat))
    if table_npu:
        print("\n| model | bucket | SoC | precision | ops on the NPU | compiled bytes | compile s | HTP simulator | "
              "cosine vs PyTorch (mean, worst output) |")
        print("|---|---|---|---|---|---|---|---|---|")
        print("\n".join(table_npu))


if __name__ == "__main__":
    main()
