"""Training throughput of arith_lm: eager vs compiled vs compiled-with-Pallas.

    .venv/bin/python bench/train.py [--steps 30] [--warmup 5] [--batch 64] [--threads 2] [--json out.json]

Reports samples/s and achieved GFLOP/s of full training steps (forward,
backward, AdamW) against this machine's fp32 matmul peak measured in the
same run (torch.mm, square matrices, same thread count). FLOPs per sample
come from the task (6 x matmul parameters x tokens + attention). The Pallas
mode compiles with Inductor's Pallas code generator; on CPU its kernels run
in JAX's interpret mode, so it measures a correctness path, not a fast one.
"eager+pallas-kernels" routes RMSNorm and attention through tpu_pipeline.kernels'
hand-written Pallas kernels (use_kernels(model, "pallas"); interpret mode on CPU).
Results go in docs/BENCHMARKS.md (train section).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")


def matmul_peak(n: int = 1024, repeats: int = 20) -> float:
    """Best fp32 GFLOP/s of an n x n matmul (the reference every mode is compared with)."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def bench_mode(mode: str, *, steps: int, warmup: int, batch: int) -> dict:
    import torch

    from tpu_pipeline import compile as tp_compile
    from tpu_pipeline import select_device
    from tpu_pipeline.train.loop import sample_indices
    from tpu_pipeline.train.runner import load_recipe
    from tpu_pipeline.train.tasks import get_task

    _, recipe = load_recipe("arith_lm", {"loop.batch_size": batch, "arith.n_train": 4000, "arith.n_heldout": 10})
    task = get_task(recipe, "arith_lm")
    p = select_device("auto")
    torch.manual_seed(0)
    model = task.build_model().to(p.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step_model = model
    if mode == "eager+pallas-kernels":  # tpu_pipeline.kernels' hand-written Pallas RMSNorm + attention
        from tpu_pipeline.kernels import use_kernels

        use_kernels(model, "pallas")
    elif mode != "eager":
        step_model = tp_compile(model, platform=p, pallas=(mode == "compiled+pallas"))

    def step(i: int) -> float:
        b = {k: v.to(p.device) for k, v in task.make_batch(sample_indices(0, i, task.num_train, batch)).items()}
        loss = task.loss_sum(step_model, b) / task.count(b)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return float(loss.detach())

    t0 = time.perf_counter()
    first = step(0)
    first_s = time.perf_counter() - t0
    for i in range(1, warmup):
        step(i)
    times = []
    for i in range(warmup, warmup + steps):
        t = time.perf_counter()
        last = step(i)
        times.append(time.perf_counter() - t)
    med = statistics.median(times)
    flops = task.flops_per_sample(model)
    return {"mode": mode, "first_step_s": round(first_s, 2), "median_step_s": med, "samples_per_s": batch / med,
            "gflops_per_s": flops * batch / med / 1e9, "flops_per_sample": flops, "loss_first": first,
            "loss_last": last, "params": sum(q.numel() for q in model.parameters()), "seq_len": task.seq_len}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30, help="timed steps per mode")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation happens here)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads [default: torch's]")
    ap.add_argument("--modes", default="eager,compiled,compiled+pallas,eager+pallas-kernels")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    peak = matmul_peak()
    rows = []
    for mode in a.modes.split(","):
        try:
            r = bench_mode(mode, steps=a.steps, warmup=a.warmup, batch=a.batch)
        except Exception as e:  # noqa: BLE001 - a mode that fails is reported, the others still run
            r = {"mode": mode, "error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"}
        rows.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
    peak_after = matmul_peak()
    result = {"machine": f"{platform.machine()} {platform.processor() or ''}".strip(), "cpus": os.cpu_count(),
              "threads": torch.get_num_threads(), "torch": torch.__version__, "batch": a.batch, "steps": a.steps,
              "matmul_peak_gflops": {"before": peak, "after": peak_after}, "modes": rows,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    ref = max(peak, peak_after)
    eager = next((r for r in rows if r["mode"] == "eager" and "error" not in r), None)
    print(f"matmul peak (fp32, 1024^3, {result['threads']} threads): {peak:.1f} / {peak_after:.1f} GFLOP/s (before/after)")
    print("| mode | samples/s | GFLOP/s | % of matmul peak | vs eager | first step (s) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['mode']} | failed: {r['error']} | | | | |")
            continue
        vs = f"{r['samples_per_s'] / eager['samples_per_s']:.2f}x" if eager else "-"
        print(f"| {r['mode']} | {r['samples_per_s']:.0f} | {r['gflops_per_s']:.1f} | "
              f"{100 * r['gflops_per_s'] / ref:.1f}% | {vs} | {r['first_step_s']:.1f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
