"""Where `rl --engine verl` spends its start-up on this CPU box, with and without the
start-up cuts of rl/verl_bridge.py (vLLM's worker inside its engine-core process, no Ray
dashboard, no prestarted idle Ray workers), on the same tiny policy and 3 steps.

Wall seconds on the shared 2-core box follow whatever else runs; two figures that do not
are reported beside them: how many processes the launch started, and the CPU seconds
they used (each process's utime+stime, last seen by a 0.5 s sampler of every process
carrying the launch's marker). The phases are eval.json's startup_phases.

    .venv/bin/python bench/verl_startup.py --policy DIR [--json]

DIR: a Hugging Face policy vLLM's CPU attention runs (head_dim 64, e.g. the rl tests'
verl_policy fixture).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from tpu_pipeline.rl import run, verl_bridge
from tpu_pipeline.rl.verl_launch import MARKER

SMALL = {"data.heldout_n": 40, "trainer.prompts_per_step": 8, "rollout.n": 4, "trainer.eval_k": 0,
         "trainer.eval_every": 0, "trainer.save_every": 3, "trainer.threads": 1, "trainer.time_budget_s": 0.0,
         "trainer.kernels": "torch"}
CUTS = ("distributed_executor_backend", "include_dashboard")


class Sampler(threading.Thread):
    """Every process whose environment carries a --engine verl marker: its name and CPU seconds."""

    def __init__(self):
        super().__init__(daemon=True)
        self.seen: dict[str, dict] = {}
        self.peak = 0
        self.stop = threading.Event()
        self.tick = os.sysconf("SC_CLK_TCK")

    def run(self) -> None:
        while not self.stop.is_set():
            live = 0
            for e in Path("/proc").iterdir():
                if not e.name.isdigit():
                    continue
                try:
                    if f"{MARKER}=".encode() not in (e / "environ").read_bytes():
                        continue
                    st = (e / "stat").read_text().rsplit(")", 1)[1].split()
                    name = (e / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
                except OSError:
                    continue
                live += 1
                d = self.seen.setdefault(e.name, {"name": name})
                d["cpu_s"] = (int(st[11]) + int(st[12])) / self.tick
                if name.startswith("ray::"):
                    d["name"] = name.split(".")[0]
            self.peak = max(self.peak, live)
            time.sleep(0.5)


def launch(policy: str, cuts: bool) -> dict:
    saved_env, saved_fn = dict(verl_bridge.LOCAL_RAY_ENV), verl_bridge.cpu_overrides
    if not cuts:  # the configuration before the start-up cuts
        verl_bridge.LOCAL_RAY_ENV.clear()
        verl_bridge.cpu_overrides = lambda *a, **k: [o for o in saved_fn(*a, **k) if not any(c in o for c in CUTS)]
    sampler = Sampler()
    sampler.start()
    t0 = time.time()
    try:
        with tempfile.TemporaryDirectory(prefix="verl-startup-") as tmp:
            res = run("grpo_math", Path(tmp) / "run", engine="verl", steps=3, policy=policy, overrides=SMALL,
                      progress=False, log=lambda _m: None)
    finally:
        sampler.stop.set()
        sampler.join()
        verl_bridge.LOCAL_RAY_ENV.update(saved_env)
        verl_bridge.cpu_overrides = saved_fn
    by_name: Counter = Counter()
    for d in sampler.seen.values():
        by_name[d["name"].split("/")[-1] if not d["name"].startswith("ray::") else d["name"]] += d["cpu_s"]
    return {"cuts": cuts, "wall_s": round(time.time() - t0, 1), "startup_s": res["startup_seconds"],
            "processes": len(sampler.seen), "peak_live": sampler.peak,
            "cpu_s": round(sum(d["cpu_s"] for d in sampler.seen.values()), 1),
            "cpu_s_by_process": {k: round(v, 1) for k, v in by_name.most_common(12)},
            "phases": res["startup_phases"], "load_avg": os.getloadavg()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", required=True)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [launch(args.policy, cuts) for cuts in (True, False)]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        print(f"{'with' if r['cuts'] else 'without'} the cuts: start-up {r['startup_s']:.0f} s, wall {r['wall_s']:.0f} s, "
              f"{r['processes']} processes (peak {r['peak_live']} live), {r['cpu_s']:.0f} CPU-s, "
              f"load {r['load_avg'][0]:.1f}")
        for p in r["phases"]:
            print(f"  {p['phase']:<48} +{p['took_s']:5.1f} s")


if __name__ == "__main__":
    main()
