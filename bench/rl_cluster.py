"""VeRL's step on a running Ray cluster: the trainer on one node against the same trainer spread
over two (issue 41). Starts the two-node loopback cluster `make test` uses
(tpu_pipeline.testing.ray_cluster: `ray start --head` + `ray start --address`, CPUs only, token
auth), submits the same tiny GRPO run with `--nnodes 1` and then `--nnodes 2` (each
`--steps N`), prints each run's per-step seconds and start-up, and stops the nodes by id.

    .venv/bin/python bench/rl_cluster.py --steps 3 --json runs/bench_cluster.json

Both nodes are this machine: two nodes here means two FSDP processes and two vLLM servers
sharing the same cores, plus gloo across the loopback, so it measures the cost of spreading,
not a speed-up a second machine would bring.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SMALL = {"data.heldout_n": 40, "trainer.prompts_per_step": 8, "rollout.n": 4, "trainer.eval_k": 2,
         "trainer.eval_every": 0, "trainer.save_every": 0, "trainer.threads": 1, "trainer.time_budget_s": 0.0,
         "trainer.kernels": "torch"}


def tiny_policy(folder: Path) -> Path:
    import torch

    from tpu_pipeline.train.tasks import char_lm

    torch.manual_seed(0)
    char_lm.build_model(hidden_size=128, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                        num_key_value_heads=2).save_pretrained(folder)
    char_lm.build_tokenizer().save_pretrained(folder)
    return folder


def main() -> None:
    from tpu_pipeline.rl.verl_bridge import trainer_python
    from tpu_pipeline.testing.ray_cluster import start_cluster

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    policy = tiny_policy(work / "policy")
    cluster = start_cluster(Path(trainer_python()).parent / "ray")
    rows = []
    try:
        (work / "home").mkdir()
        env = cluster.client_env(home=work / "home", token=cluster.token)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests" / "rl"), env.get("PYTHONPATH", "")])
        for nnodes in (1, 2):
            out = work / f"nnodes{nnodes}"
            cmd = [sys.executable, "-m", "tpu_pipeline", "rl", "--engine", "verl", "--steps", str(a.steps),
                   "--nnodes", str(nnodes), "--ray-address", cluster.address, "--policy", str(policy),
                   "--out", str(out), "--reward", "rewards_for_tests:odd_char_sum"]
            cmd += [x for k, v in SMALL.items() for x in ("--set", f"{k}={v}")]
            t0 = time.time()
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if p.returncode != 0:
                raise SystemExit(f"nnodes={nnodes}: exit {p.returncode}: {p.stderr[-2000:]}")
            ev = json.loads((out / "eval.json").read_text())
            steps = [json.loads(x)["step_seconds"] for x in (out / "metrics.jsonl").read_text().splitlines()]
            rows.append({"nnodes": nnodes, "step_seconds": [round(s, 2) for s in steps],
                         "startup_seconds": ev["startup_seconds"], "wall_seconds": round(time.time() - t0, 1),
                         "nodes_used": ev.get("nodes_used"), "load_average": os.getloadavg()[0]})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        left = cluster.stop()
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"runs": rows, "left": left, "cpus": os.cpu_count()}, indent=2))


if __name__ == "__main__":
    main()
