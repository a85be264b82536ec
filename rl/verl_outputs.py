"""A VeRL run's figures and policy in the local engine's layout.

VeRL's file logger writes DIR/verl/metrics.jsonl ({"step", "data": {...}});
`MetricsFollower` turns each new row into a row of DIR/metrics.jsonl in the
local engine's schema (reward, accuracy, response_length, step_seconds, ...)
while the trainer runs. `finish` copies the last checkpoint's Hugging Face
folder to DIR/policy, scores the starting and the trained policy on the
recipe's held-out problems with this package's evaluator (the same numbers
the local engine reports) and writes eval.json and curve.png.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Callable

import tpu_pipeline
from tpu_pipeline.errors import UserError
from tpu_pipeline.files import atomic_write_json, staged_dir
from tpu_pipeline.metrics import MetricsWriter
from tpu_pipeline.rl.curve import plot_curve
from tpu_pipeline.rl.data import build_source
from tpu_pipeline.rl.evaluate import evaluate
from tpu_pipeline.rl.policy import load_policy
from tpu_pipeline.rl.recipe import RLConfig
from tpu_pipeline.rl.rewards import GuardedReward, load_reward
from tpu_pipeline.rl.task_eval import write_record
from tpu_pipeline.rl.verl_startup import phases

# local row key <- VeRL metric key (verl/trainer/ppo/metric_utils.py, ray_trainer.py)
VERL_KEYS = {
    "reward": "critic/rewards/mean",          # the reward advantages were computed on
    "score": "critic/score/mean",             # the verifier's score (reward before any shaping)
    "response_length": "response_length/mean",
    # not "truncated": VeRL's response_length/clip_ratio is the share of responses as long as the
    # batch's longest (metric_utils compares with responses.shape[-1], the padded width), which
    # counts answers that ended with EOS; the local engine's is the share that never reached EOS
    "kl": "actor/kl_loss",
    "pg_loss": "actor/pg_loss",
    "grad_norm": "actor/grad_norm",
    "step_seconds": "timing_s/step",
    "rollout_seconds": "timing_s/gen",
    "update_seconds": "timing_s/update_actor",
    "weight_sync_seconds": "timing_s/update_weights",
    # VeRL only: the largest gap between vLLM's sampling probabilities and the trainer's recomputed
    # ones (ray_trainer's rollout_probs_diff): ~1e-2 when the trainer computes in bf16, ~1e-6 in float32
    "rollout_probs_diff_max": "training/rollout_probs_diff_max",
    # and its mean: a whole stale layer moves the mean, one odd token only the max
    "rollout_probs_diff_mean": "training/rollout_probs_diff_mean",
}


# VeRL's "actor/lr" is the rate its scheduler holds after the step (verl/workers/engine_workers.py
# train_batch: lr_scheduler_step() returns get_last_lr() after stepping), i.e. the next update's; the
# local engine's row "lr" is the rate this step's update ran at. MetricsFollower shifts it by one.
VERL_NEXT_LR = "actor/lr"


def local_row(step: int, data: dict, elapsed: float, lr: float | None = None) -> dict:
    """One VeRL metrics row in the local engine's schema. accuracy: the share of samples
    the verifier scored 1, from VeRL's per-sample score (the recipe's rewards score 0 or 1;
    critic/score/mean is that share) when every score is 0/1 at its extremes. `lr`: the rate
    this step's update ran at (see VERL_NEXT_LR)."""
    row = {"step": step}
    if lr is not None:
        row["lr"] = float(lr)
    for k, vk in VERL_KEYS.items():
        if isinstance(data.get(vk), (int, float)):
            row[k] = float(data[vk])
    lo, hi = data.get("critic/score/min"), data.get("critic/score/max")
    if "score" in row and lo is not None and hi is not None and lo >= 0.0 and hi <= 1.0:
        row["accuracy"] = row["score"]
    row["elapsed_seconds"] = elapsed
    return row


class MetricsFollower:
    """Follows DIR/verl/metrics.jsonl and appends DIR/metrics.jsonl rows as they come."""

    def __init__(self, out: Path, *, total_steps: int, log: Callable[[str], None], first_lr: float | None = None,
                 start_step: int = 0):
        """`first_lr`: the rate of the first update (VeRL logs each update's successor only).
        `start_step`: the step a resumed run continues from; DIR/metrics.jsonl keeps its rows up to
        it (a killed run may have logged a step whose checkpoint it did not finish)."""
        self.src = out / "verl" / "metrics.jsonl"
        self.writer = MetricsWriter(out, total_steps=total_steps, start_step=start_step, progress=False,
                                    description="rl", tb_prefix="rl", lines=False)
        kept = [json.loads(x) for x in self.writer.path.read_text().splitlines()] \
            if start_step and self.writer.path.is_file() else []
        self.log = log
        self.total = total_steps
        self.seen = 0
        self.elapsed = float(kept[-1].get("elapsed_seconds", 0.0)) if kept else 0.0
        self.rows: list[dict] = []  # this run's
        self.lr = first_lr  # the rate the next logged step's update ran at

    def poll(self) -> None:
        try:
            lines = self.src.read_text().splitlines()
        except OSError:
            return
        for line in lines[self.seen:]:
            if not line.endswith("}"):
                break  # a row still being written
            self.seen += 1
            rec = json.loads(line)
            data = rec.get("data", {})
            if "timing_s/step" not in data:
                continue  # a validation-only row
            self.elapsed += float(data["timing_s/step"])
            row = local_row(int(rec["step"]), data, round(self.elapsed, 3), self.lr)
            if isinstance(data.get(VERL_NEXT_LR), (int, float)):
                self.lr = float(data[VERL_NEXT_LR])
            self.writer.log(row)
            self.rows.append(row)
            self.log(f"step {row['step']}/{self.total}  reward {row.get('reward', float('nan')):.3f}  "
                     f"acc {row.get('accuracy', float('nan')):.3f}  s/step {row.get('step_seconds', 0):.2f}")

    def close(self) -> None:
        self.poll()
        self.writer.close()


class BudgetWatch:
    """A recipe's time budget for VeRL's trainer, which stops only at a step count: `__call__`
    returns a reason to stop once the steps' own time (the local engine's measure: the sum of
    VeRL's timing_s/step, start-up excluded) has reached the budget and the last step's
    checkpoint is complete (VeRL saves every step under a budget: verl_bridge.save_freq)."""

    REASON = "time budget spent"

    def __init__(self, follower: MetricsFollower, checkpoints: Path, budget_s: float):
        self.follower, self.tracker, self.budget = follower, checkpoints / "latest_checkpointed_iteration.txt", budget_s

    def __call__(self) -> str | None:
        if not self.follower.rows or self.follower.elapsed < self.budget:
            return None
        try:
            saved = int(self.tracker.read_text().strip())
        except (OSError, ValueError):
            return None
        return self.REASON if saved >= self.follower.rows[-1]["step"] else None


def score_policy(cfg: RLConfig, path: Path) -> dict:
    """Held-out greedy accuracy (and pass@k) of a policy folder, as the local engine measures it."""
    platform = tpu_pipeline.select_device("cpu" if cfg.trainer.device == "auto" else cfg.trainer.device)
    source = build_source(cfg.data, cfg.trainer.seed)
    model, tok = load_policy(path, platform.device)
    guard = GuardedReward(load_reward(cfg.trainer.reward), cfg.trainer.reward_timeout_s)
    d, t = cfg.data, cfg.trainer
    try:
        res = evaluate(model, tok, source.heldout(), lambda items: guard(items).scores,
                       max_prompt_length=d.max_prompt_length, max_response_length=d.max_response_length,
                       overlong=d.overlong_prompt, k=t.eval_k, temperature=t.eval_temperature,
                       precision=t.precision)
    finally:
        guard.close()
    return {**res, "policy": str(path)}


def has_chat_template(policy: Path) -> bool:
    try:
        if json.loads((policy / "tokenizer_config.json").read_text()).get("chat_template"):
            return True
    except (OSError, ValueError):
        pass
    return (policy / "chat_template.jinja").is_file() or (policy / "chat_template.json").is_file()


def finish(cfg: RLConfig, out: Path, result: dict, *, policy_path: Path, checkpoint: Path | None, started: float,
           log: Callable[[str], None]) -> dict:
    """DIR/policy, eval.json and curve.png from a finished VeRL run; returns eval.json's content."""
    hf = checkpoint / "actor" / "huggingface" if checkpoint else None
    if hf is None or not any(hf.glob("*.safetensors")):
        raise UserError(f"--engine verl: VeRL finished without a Hugging Face checkpoint under {checkpoint}")
    # VeRL saves the chat template it was given; a policy that had none keeps none (the
    # template only stood in for the local engine's plain prompt text)
    skip = set() if has_chat_template(policy_path) else {"chat_template.jinja", "chat_template.json"}
    with staged_dir(out / "policy") as stage:
        for f in hf.iterdir():
            if f.is_file() and f.name not in skip:
                shutil.copy2(f, stage / f.name)
        write_record(cfg, stage, engine="verl")
    log(f"evaluating the starting and the trained policy on {cfg.data.heldout_n} held-out problems")
    before, after = score_policy(cfg, policy_path), score_policy(cfg, out / "policy")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()] \
        if (out / "metrics.jsonl").is_file() else []
    evals = {
        "engine": "verl", "before": before, "after": after,
        "gain_points": round(100 * (after["accuracy"] - before["accuracy"]), 2),
        "steps": len(rows), "rl_seconds": round(sum(r.get("step_seconds", 0.0) for r in rows), 2),
        "trainer_seconds": result["trainer_seconds"],
        "startup_seconds": round(result["trainer_seconds"] - result["run_step_seconds"], 2),
        "wall_seconds": round(time.time() - started, 2), "checkpoint": str(checkpoint),
        "warm_start": {"path": str(policy_path)}, "recipe": cfg.name, "device": result["device"],
        "command": result["command"], "leftover_processes": result["leftover_processes"],
        "startup_phases": phases(Path(result["log"])),
        "stopped": result.get("stopped"),  # why the trainer stopped before its step count, if it did
    }
    atomic_write_json(out / "eval.json", evals)
    try:
        evals["curve"] = str(plot_curve(out, evals))
    except Exception as e:  # a plotting failure must not lose a finished run
        log(f"warning: learning-curve plot failed ({type(e).__name__}: {e})")
    atomic_write_json(out / "eval.json", evals)
    return evals
