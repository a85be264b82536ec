"""What the GPU-accelerator (android) and WebGPU (web) checks add to `convert --targets all`.

    .venv/bin/python bench/accelerator_cost.py --repeats 3

A 64x64 DepthwiseCNN (tpu_pipeline.testing.reference_models) is converted with the shipped
profiles ("on") and with copies whose `gpu_accelerator` / `webgpu` are "off", interleaved
with bare litert-torch exports of the same model; prints each run and the medians as ratios
to the bare export measured in the same run (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import litert_torch
import torch

from tpu_pipeline.convert import convert
from tpu_pipeline.convert.targets import profile_dir
from tpu_pipeline.convert.tool_output import quiet_native
from tpu_pipeline.testing import reference_models

OFF_FIELDS = (("android.toml", "gpu_accelerator"), ("web.toml", "webgpu"))


def profiles_with_checks_off(dest: Path) -> Path:
    shutil.copytree(profile_dir(), dest)
    for name, key in OFF_FIELDS:
        path = dest / name
        text = path.read_text()
        line = next(ln for ln in text.splitlines() if ln.startswith(key + " "))
        path.write_text(text.replace(line, f'{key} = "off"  # bench/accelerator_cost.py'))
    return dest


def cpu_seconds() -> float:
    """User + system CPU time of this process and its reaped children (Chromium with its renderer
    and GPU process, the GPU worker, TFLM): what a run costs the cores, beside its wall time."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="accel-cost-"))
    off = profiles_with_checks_off(tmp / "profiles_off")
    torch.manual_seed(0)
    model = reference_models.DepthwiseCNN(in_channels=3, size=64, width=32, blocks=4, classes=100).eval()
    args = (torch.randn(1, 3, 64, 64),)

    cpu_s: dict[str, list[float]] = {"bare": [], "on": [], "off": []}

    def bare() -> float:
        t, c = time.perf_counter(), cpu_seconds()
        with quiet_native():
            litert_torch.convert(model, args).export(str(tmp / "bare.tflite"))
        cpu_s["bare"].append(cpu_seconds() - c)
        return time.perf_counter() - t

    def run(profiles, tag: str, i: int) -> float:
        t, c = time.perf_counter(), cpu_seconds()
        with quiet_native():
            r = convert(model, args, targets="all", out=tmp / f"{tag}{i}", profile_dir=profiles)
        wall, cpu = time.perf_counter() - t, cpu_seconds() - c
        cpu_s.setdefault(tag, []).append(cpu)
        stages = {n: {k: round(v, 2) for k, v in tr.timings_s.items() if v >= 0.01} for n, tr in r.targets.items()}
        print(tag, f"{wall:.2f} s", f"cpu {cpu:.2f} s", f"export {r.report['export_s']:.2f} s", "per target s:",
              stages, "passed:", r.passed, flush=True)
        return wall

    bare()
    run(None, "warm", 0)  # first-run imports and caches, not counted
    walls = {"bare": [], "on": [], "off": []}
    for i in range(a.repeats):
        walls["bare"].append(bare())
        for tag, profiles in (("off", off), ("on", None)):
            walls[tag].append(run(profiles, tag, i))
    b = statistics.median(walls["bare"])
    print(f"bare export median {b:.2f} s, {statistics.median(cpu_s['bare']):.2f} CPU-s")
    for tag in ("off", "on"):
        m = statistics.median(walls[tag])
        print(f"checks {tag}: median {m:.2f} s, {m / b:.2f}x the bare export, "
              f"{statistics.median(cpu_s[tag]):.2f} CPU-s")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
