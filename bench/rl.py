"""GRPO step time and rollout tokens/s: tpu-pipeline's local engine against
TRL's GRPOTrainer, on the same model, prompts, group size, batch and CPU
threads, in one process run (pip install 'tpu-pipeline[bench]' for TRL).

    .venv/bin/python bench/rl.py speed --threads 2 --steps 6 [--policy HF_DIR]
    .venv/bin/python bench/rl.py control --warm-start DIR --seconds S   # supervised control for docs
    .venv/bin/python bench/rl.py control --recipe grpo_countdown --warm-start DIR --seconds S
    .venv/bin/python bench/rl.py curves runs/grpo_math runs/dapo_math --png docs/rl_dapo_vs_grpo.png

Both sides: 64 prompts x 8 samples, temperature 1, at most 12 new tokens,
lr 3e-5, no KL (TRL beta=0), one optimisation pass per batch, float32 on CPU.
The first step of each side is a warm-up and is not counted; medians of the
rest are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _policy(path: str | None, out: Path) -> Path:
    if path:
        return Path(path)
    import torch

    from tpu_pipeline.train.tasks import char_lm

    torch.manual_seed(0)
    tok, model = char_lm.build_tokenizer(), char_lm.build_model()  # the arith_lm size (~1.8M parameters)
    model.save_pretrained(out / "policy")
    tok.save_pretrained(out / "policy")
    return out / "policy"


def _problems(n_steps: int, prompts: int):
    from tpu_pipeline.rl.recipe import load_recipe
    from tpu_pipeline.rl.data import build_source

    cfg = load_recipe("grpo_math")
    src = build_source(cfg.data, 0)
    return [src.train_batch(s, prompts, 0) for s in range(n_steps)]


def bench_ours(policy: Path, batches, n: int, out: Path) -> dict:
    from tpu_pipeline.rl.recipe import load_recipe
    from tpu_pipeline.rl.engine import Engine
    from tpu_pipeline.rl.policy import build_optimizer, load_policy
    from tpu_pipeline.rl.rewards import GuardedReward
    from tpu_pipeline.train.tasks.rewards import compute_score

    cfg = load_recipe("grpo_math", {"rollout.n": n, "trainer.prompts_per_step": len(batches[0]),
                                    "trainer.kernels": "torch", "trainer.track_kl": False})

    class Fixed:  # the same prompts TRL sees, step by step
        def train_batch(self, step, k, seed):
            return batches[step]

    model, tok = load_policy(policy)
    opt, _ = build_optimizer(model, lr=cfg.optim.lr, weight_decay=0.0, carry_from=None)
    eng = Engine(cfg=cfg, model=model, tokenizer=tok, optimizer=opt, source=Fixed(),
                 reward=GuardedReward(compute_score, 5.0), out=out, device="cpu")
    rows = []
    for s in range(len(batches)):
        eng.step = s
        t0 = time.perf_counter()
        r = eng.train_step()
        r["wall"] = time.perf_counter() - t0
        r["tokens"] = r["response_length"] * len(batches[0]) * n
        rows.append(r)
    return _summary([r["wall"] for r in rows], [r["rollout_seconds"] for r in rows], [r["tokens"] for r in rows])


def bench_trl(policy: Path, batches, n: int, out: Path) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from tpu_pipeline.train.tasks.rewards import compute_score

    tok = AutoTokenizer.from_pretrained(policy)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    rows = [{"prompt": p.prompt, "ground_truth": p.ground_truth, "source": p.data_source} for b in batches for p in b]
    ds = Dataset.from_list(rows)

    def reward(completions, ground_truth, source, **kw):
        return [compute_score(s, c, g) for c, g, s in zip(completions, ground_truth, source)]

    P = len(batches[0])
    args = GRPOConfig(output_dir=str(out / "trl"), per_device_train_batch_size=P * n, num_generations=n,
                      max_completion_length=12, temperature=1.0, top_k=0, top_p=1.0, learning_rate=3e-5, beta=0.0,
                      num_iterations=1, max_steps=len(batches), logging_steps=1, report_to=[], save_strategy="no",
                      use_cpu=True, bf16=False, shuffle_dataset=False, dataloader_num_workers=0,
                      disable_dropout=True, loss_type="grpo", scale_rewards="group")
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok)
    gen_times, gen_tokens, step_times = [], [], []
    inner = trainer.model.generate

    def timed_generate(*a, **kw):
        t0 = time.perf_counter()
        outp = inner(*a, **kw)
        gen_times.append(time.perf_counter() - t0)
        ids = kw.get("input_ids", a[0] if a else None)
        comp = outp[:, ids.shape[1]:]
        eos = (comp == tok.eos_token_id).int()
        seen = eos.cumsum(1) - eos  # tokens up to and including the first EOS
        gen_tokens.append(int(((seen == 0) & (comp != tok.pad_token_id) | (eos.bool() & (seen == 0))).sum()))
        return outp

    trainer.model.generate = timed_generate

    class Timer(TrainerCallback):
        def on_step_begin(self, a, s, c, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, a, s, c, **kw):
            step_times.append(time.perf_counter() - self.t0)

    trainer.add_callback(Timer())
    trainer.train()
    return _summary(step_times, gen_times, gen_tokens)


def _summary(steps, rollouts, tokens) -> dict:
    s, r, t = steps[1:], rollouts[1:], tokens[1:]  # first step is warm-up
    return {"steps_timed": len(s), "step_seconds_median": statistics.median(s),
            "rollout_seconds_median": statistics.median(r),
            "rollout_tokens_per_second": sum(t) / sum(r), "step_seconds_all": [round(x, 3) for x in steps]}


def speed(a) -> dict:
    import torch

    torch.set_num_threads(a.threads)
    out = Path(tempfile.mkdtemp(prefix="bench_rl_"))
    policy = _policy(a.policy, out)
    batches = _problems(a.steps, a.prompts)
    ours = bench_ours(policy, batches, a.n, out)
    trl = bench_trl(policy, batches, a.n, out)
    import trl as trl_mod

    return {"threads": a.threads, "prompts": a.prompts, "n": a.n, "steps": a.steps, "policy": str(policy),
            "trl_version": trl_mod.__version__, "ours": ours, "trl": trl,
            "step_speedup": trl["step_seconds_median"] / ours["step_seconds_median"],
            "rollout_tokens_per_second_ratio": ours["rollout_tokens_per_second"] / trl["rollout_tokens_per_second"]}


def control(a) -> dict:
    import torch

    from tpu_pipeline.rl.recipe import load_recipe
    from tpu_pipeline.rl.control import supervised_control

    if a.threads:
        torch.set_num_threads(a.threads)
    cfg = load_recipe(a.recipe)
    return supervised_control(cfg, a.warm_start, a.seconds, lr=a.lr, k=a.k)


def curves(a) -> dict:
    """Held-out greedy accuracy against RL wall time for several run folders (their
    metrics.jsonl and eval.json), on one plot: e.g. grpo_math and dapo_math, same seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tpu_pipeline.metrics import read_metrics

    fig, ax = plt.subplots(figsize=(7, 4))
    out = {}
    for run in a.runs:
        run = Path(run)
        ev = json.loads((run / "eval.json").read_text())
        rows = read_metrics(run / "metrics.jsonl")
        pts = [(0.0, ev["before"]["accuracy"])]
        pts += [(r["elapsed_seconds"], r["heldout_accuracy"]) for r in rows if "heldout_accuracy" in r]
        pts.append((ev["rl_seconds"], ev["after"]["accuracy"]))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=3, label=f"{ev['recipe']} ({ev['steps']} steps)")
        out[ev["recipe"]] = {"curve": [(round(t, 1), round(acc, 4)) for t, acc in pts], "steps": ev["steps"],
                             "before": ev["before"], "after": ev["after"], "gain_points": ev["gain_points"]}
    ax.set_xlabel("RL wall time (s)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(a.png, dpi=110)
    out["png"] = a.png
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("speed")
    s.add_argument("--threads", type=int, default=2)
    s.add_argument("--steps", type=int, default=6)
    s.add_argument("--prompts", type=int, default=64)
    s.add_argument("--n", type=int, default=8)
    s.add_argument("--policy", default=None)
    c = sub.add_parser("control")
    c.add_argument("--recipe", default="grpo_math")
    c.add_argument("--warm-start", required=True)
    c.add_argument("--seconds", type=float, required=True)
    c.add_argument("--lr", type=float, default=1e-4)
    c.add_argument("--k", type=int, default=8)
    c.add_argument("--threads", type=int, default=0)
    v = sub.add_parser("curves")
    v.add_argument("runs", nargs="+")
    v.add_argument("--png", required=True)
    for x in (s, c, v):
        x.add_argument("--json-out", default=None)
    a = p.parse_args()
    res = {"speed": speed, "control": control, "curves": curves}[a.cmd](a)
    text = json.dumps(res, indent=2)
    print(text)
    if a.json_out:
        Path(a.json_out).write_text(text + "\n")


if __name__ == "__main__":
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    sys.exit(main())
