"""android-npu on the MLPerf Tiny models, the digits CNN and three zoo architectures: per model and
SoC, the precision that shipped, ops on the NPU / total, partitions, compiled bytes, LiteRT's AOT
compile time, the HTP simulator's time per row, the simulator against XNNPACK (largest |difference|,
in output quantization steps for int8 outputs) and against PyTorch (mean cosine, top-1 agreement).

The simulator runs the profile's npu_simulator_rows (16) of the parity rows per SoC.
Prints a markdown table; writes OUT/npu.json. Needs the [npu] extra.
    nice -n 5 .venv/bin/python bench/npu.py --out /tmp/bench_npu          # ~10 min on 2 shared cores
    .venv/bin/python bench/npu.py --models kws,digits --samples 16 --out /tmp/bench_npu
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import tpu_pipeline.convert as tc
from tpu_pipeline.testing import mlperf_tiny, trained_models, zoo
from tpu_pipeline.testing.tables import markdown_rows

ZOO = ("resnet", "mobilenet_v2", "vit")


def _model(name: str):
    """(module, sample args, calibration rows)"""
    if name in mlperf_tiny.NAMES:
        b = mlperf_tiny.build(name)
        return b.module, b.sample_args, b.calib
    if name == "digits":
        t = trained_models.digits()
        return t.module.eval(), (t.example,), [(torch.from_numpy(x[None]),) for x in t.calib[:128]]
    b = zoo.build(name, "tiny")
    return b.module, b.sample_args, [b.sample_batch(1) for _ in range(32)]


def run(name: str, out: Path, samples: int) -> list[dict]:
    m, args, calib = _model(name)
    t0 = time.perf_counter()
    res = tc.convert(m, args, targets="android-npu", out=out / name, calibration=calib, samples=samples,
                     latency=False)
    t = res["android-npu"]
    npu = t.npu or {}
    base = {"model": name, "precision": t.quantization, "passed": t.passed, "convert_s": time.perf_counter() - t0,
            "cpu_cosine": t.metrics.get("cosine_mean"), "reasons": t.reasons[:2], "chosen_because": t.chosen_because}
    out_rows = []
    for soc, f in (npu.get("socs") or {"-": {}}).items():
        sim = f.get("simulator") or {}
        vs_t = list((sim.get("vs_pytorch") or {}).values())
        vs_x = list((sim.get("vs_xnnpack") or {}).values())
        out_rows.append({**base, "soc": soc, "ops": f"{f.get('ops_on_npu')}/{f.get('ops_total')}",
                         "partitions": f.get("partitions"), "cpu_ops": (f.get("cpu_ops") or {}).get("by_op"),
                         "bytes": f.get("size_bytes"), "compile_s": f.get("compile_s"),
                         "sim_rows": sim.get("rows"), "sim_s_per_row": sim.get("s_per_row"),
                         "vs_xnnpack_max_abs": max((v["max_abs"] for v in vs_x), default=None),
                         "vs_xnnpack_lsb": max((v["max_lsb"] for v in vs_x if "max_lsb" in v), default=None),
                         "sim_cosine": min((v.get("cosine_mean", v.get("cosine")) for v in vs_t), default=None),
                         "sim_top1": vs_t[0].get("top1") if vs_t else None,
                         "soc_passed": f.get("passed"), "qnn": npu.get("qnn_version")})
    return out_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join([*mlperf_tiny.NAMES, "digits", *ZOO]))
    ap.add_argument("--samples", type=int, default=64, help="parity rows (XNNPACK, PyTorch)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench_npu"))
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in a.models.split(","):
        for r in run(name, a.out, a.samples):
            rows.append(r)
            print(json.dumps(r), flush=True)
    (a.out / "npu.json").write_text(json.dumps(rows, indent=1))
    cols = ["model", "precision", "soc", "ops", "partitions", "bytes", "compile_s", "sim_s_per_row",
            "vs_xnnpack_max_abs", "vs_xnnpack_lsb", "sim_cosine", "sim_top1", "cpu_cosine", "passed"]
    print(markdown_rows(rows, cols))


if __name__ == "__main__":
    main()
