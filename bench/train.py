"""Training throughput of arith_lm: eager vs compiled vs compiled-with-Pallas.

    .venv/bin/python bench/train.py [--steps 30] [--warmup 5] [--batch 64] [--threads 2] [--json out.json]

Reports samples/s and achieved GFLOP/s of full training steps (forward,
backward, AdamW) against this machine's fp32 matmul peak measured in the
same run (1024^3 torch.mm, same thread count). Modes are timed interleaved,
one step of each per round beside one matmul, so the load of a shared
machine falls on all of them alike; medians over the rounds. FLOPs per sample
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


def matmul_gflops(a, b) -> float:
    """fp32 GFLOP/s of one a @ b (the reference every mode is compared with)."""
    t = time.perf_counter()
    a @ b
    return 2 * a.shape[0] * a.shape[1] * b.shape[1] / (time.perf_counter() - t) / 1e9


def setup_mode(mode: str, *, batch: int):
    """A step function for `mode` over its own model and AdamW (same init and data)."""
    import torch

    from tpu_pipeline import compile as tp_compile
    from tpu_pipeline import select_device
    from tpu_pipeline.train.loop import sample_indices
    from tpu_pipeline.train.runner import get_task, load_recipe

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
        step_model = tp_compile(model, platform=p, inductor_pallas=(mode == "compiled+pallas"))

    def step(i: int) -> float:
        b = {k: v.to(p.device) for k, v in task.make_batch(sample_indices(0, i, task.num_train, batch)).items()}
        loss = task.loss_sum(step_model, b) / task.count(b)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return float(loss.detach())

    info = {"flops_per_sample": task.flops_per_sample(model), "params": sum(q.numel() for q in model.parameters()),
            "seq_len": task.seq_len}
    return step, info


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
    # Modes are timed interleaved (one step of each per round, a matmul beside them),
    # so that the load of this shared machine hits every mode and the peak alike.
    ma, mb = torch.randn(1024, 1024), torch.randn(1024, 1024)
    for _ in range(3):
        ma @ mb
    modes, rows = {}, {}
    for mode in a.modes.split(","):
        try:
            step, info = setup_mode(mode, batch=a.batch)
            t0 = time.perf_counter()
            first = step(0)
            info["first_step_s"] = round(time.perf_counter() - t0, 2)
            for i in range(1, a.warmup):
                step(i)
            modes[mode] = step
            rows[mode] = {"mode": mode, **info, "loss_first": first, "times": []}
        except Exception as e:  # noqa: BLE001 - a mode that fails is reported, the others still run
            msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            rows[mode] = {"mode": mode, "error": f"{type(e).__name__}: {msg}"}
        print(json.dumps({k: v for k, v in rows[mode].items() if k != "times"}), file=sys.stderr, flush=True)
    peaks = []
    for i in range(a.warmup, a.warmup + a.steps):
        peaks.append(matmul_gflops(ma, mb))
        for mode, step in modes.items():
            t = time.perf_counter()
            rows[mode]["loss_last"] = step(i)
            rows[mode]["times"].append(time.perf_counter() - t)
    peak = max(peaks)
    for r in rows.values():
        if "times" in r:
            med = statistics.median(r["times"])
            r.update(median_step_s=med, samples_per_s=a.batch / med,
                     gflops_per_s=r["flops_per_sample"] * a.batch / med / 1e9)
    rows = list(rows.values())
    result = {"machine": f"{platform.machine()} {platform.processor() or ''}".strip(), "cpus": os.cpu_count(),
              "threads": torch.get_num_threads(), "torch": torch.__version__, "batch": a.batch, "steps": a.steps,
              "matmul_gflops": {"max": peak, "median": statistics.median(peaks)}, "modes": rows,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    ref = peak
    eager = next((r for r in rows if r["mode"] == "eager" and "error" not in r), None)
    print(f"matmul (fp32, 1024^3, {result['threads']} threads), interleaved with the steps: "
          f"max {peak:.1f}, median {statistics.median(peaks):.1f} GFLOP/s")
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
