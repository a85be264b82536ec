"""The same rl recipe and seed through both engines (issue 20 item 3): the local engine for a
wall-time budget, then VeRL's Ray trainer (`--engine verl`) from the same warm start for a
step count that fills about the same wall time (VeRL's trainer stops at a step count, not a
clock). Held-out accuracy curves against wall time and per-step time, one table and one PNG.

    .venv/bin/python bench/rl_engines.py --recipe grpo_math --seconds 600 --verl-steps 150 \
        --out runs/bench_engines --png docs/rl_engines.png

Curves: the local engine's held-out accuracy every `eval_every` steps (its metrics.jsonl);
VeRL's from each saved checkpoint (`trainer.save_every`), scored afterwards by `tpu-pipeline
eval` on the same held-out problems with the same evaluator. The x axis is each engine's
training clock (the sum of its step times: start-up, evaluation and saving excluded; the
whole wall time is in the table). Both start from the recipe's
cached warm start (the local run trains it if the cache lacks it; that time is not counted).
Each engine runs alone: nothing else should share the cores while this runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def _cli(*args: str, log: Path) -> tuple[float, int]:
    t = time.perf_counter()
    with log.open("w") as f:
        rc = subprocess.call([str(BIN / "tpu-pipeline"), *args], stdout=f, stderr=subprocess.STDOUT)
    return time.perf_counter() - t, rc


def _rows(run: Path) -> list[dict]:
    p = run / "metrics.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def _eval(recipe: str, policy: Path, log: Path) -> float | None:
    out = subprocess.run([str(BIN / "tpu-pipeline"), "eval", "--recipe", recipe, "--policy", str(policy), "--k", "0",
                          "--json"], capture_output=True, text=True)
    log.write_text(out.stdout + out.stderr)
    try:
        return float(json.loads(out.stdout)["accuracy"])
    except (ValueError, KeyError):
        return None


def _step_seconds(rows: list[dict]) -> float | None:
    s = [r["step_seconds"] for r in rows[1:] if isinstance(r.get("step_seconds"), (int, float))]
    return statistics.median(s) if s else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default="grpo_math")
    ap.add_argument("--seconds", type=float, default=600.0, help="the local engine's RL wall-time budget")
    ap.add_argument("--verl-steps", type=int, default=150, help="VeRL's step count (about the same wall time)")
    ap.add_argument("--save-every", type=int, default=25, help="VeRL checkpoint interval: its curve's points")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/bench_engines")
    ap.add_argument("--png", default=None)
    ap.add_argument("--reuse-local", action="store_true", help="keep OUT/local from an earlier run of this script")
    # a fixed count makes the two runs alike (each engine's rule for 0 looks at the load when it starts)
    ap.add_argument("--threads", type=int, default=2, help="trainer.threads for both engines (0: each engine's rule)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    local, verl = out / "local", out / "verl"

    if a.reuse_local:
        local_wall, rc = json.loads((local / "eval.json").read_text())["wall_seconds"], 0  # the run's own wall
    else:
        local_wall, rc = _cli("rl", "--recipe", a.recipe, "--out", str(local), "--time-budget", str(a.seconds),
                              "--seed", str(a.seed), "--set", f"trainer.threads={a.threads}", log=out / "local.log")
    if rc:
        sys.exit(f"local engine exited {rc}: see {out / 'local.log'}")
    lev = json.loads((local / "eval.json").read_text())
    start = Path(lev["warm_start"]["path"])
    lrows = _rows(local)
    lcurve = [(0.0, lev["before"]["accuracy"])] + [
        (r["elapsed_seconds"], r["heldout_accuracy"]) for r in lrows if "heldout_accuracy" in r] + [
        (lev["rl_seconds"], lev["after"]["accuracy"])]

    verl_wall, rc = _cli("rl", "--recipe", a.recipe, "--engine", "verl", "--out", str(verl), "--steps",
                         str(a.verl_steps), "--policy", str(start), "--seed", str(a.seed),
                         "--set", f"trainer.save_every={a.save_every}",
                         "--set", f"trainer.threads={a.threads}", log=out / "verl.log")
    if rc:
        sys.exit(f"VeRL engine exited {rc}: see {out / 'verl.log'}")
    vev = json.loads((verl / "eval.json").read_text())
    vrows = _rows(verl)
    elapsed = {r["step"]: r.get("elapsed_seconds") for r in vrows}
    vcurve = [(0.0, vev["before"]["accuracy"])]
    for ckpt in sorted(verl.glob("**/global_step_*/actor/huggingface"),
                       key=lambda p: int(p.parent.parent.name.split("_")[-1])):
        step = int(ckpt.parent.parent.name.split("_")[-1])
        acc = _eval(a.recipe, ckpt, out / f"verl_eval_{step}.log")
        if acc is not None and elapsed.get(step) is not None:
            vcurve.append((elapsed[step], acc))

    res = {
        "machine": f"{platform.node()} ({os.cpu_count()} cores), {platform.platform()}",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
        "command": " ".join(sys.argv), "recipe": a.recipe, "seed": a.seed, "threads": a.threads,
        "local": {"wall_seconds": round(local_wall, 1), "rl_seconds": lev["rl_seconds"], "steps": lev["steps"],
                  "median_step_seconds": _step_seconds(lrows), "before": lev["before"]["accuracy"],
                  "after": lev["after"]["accuracy"], "curve": lcurve},
        "verl": {"wall_seconds": round(verl_wall, 1), "steps": vev.get("steps"),
                 "first_step_after_seconds": vrows[0].get("elapsed_seconds") if vrows else None,
                 "median_step_seconds": _step_seconds(vrows), "before": vev["before"]["accuracy"],
                 "after": vev["after"]["accuracy"], "curve": vcurve,
                 **{k: vev[k] for k in ("startup_seconds", "peak_pss_bytes", "processes") if k in vev}},
    }
    (out / "engines.json").write_text(json.dumps(res, indent=2))
    print(json.dumps({k: v for k, v in res.items()}, indent=2))
    if a.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        for name, curve in (("local engine", lcurve), ("VeRL Ray trainer", vcurve)):
            ax.plot([t / 60 for t, _ in curve], [100 * y for _, y in curve], marker="o", label=name)
        ax.set_xlabel("training time (min, start-up excluded)")
        ax.set_ylabel("held-out greedy accuracy (%)")
        ax.set_title(f"{a.recipe}, seed {a.seed}, 2 CPU cores")
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.png, dpi=120)


if __name__ == "__main__":
    main()
