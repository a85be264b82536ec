"""The supervised control of an RL recipe's report: the same warm start, the same
held-out split, and the RL phase's wall time spent on more supervised steps
on the true answers (what the warm start would have gained from more
supervision instead of RL).

It continues the warm start's optimizer (AdamW moments carried) at the
learning rate its schedule ended on, with its batch size, on batches the
recipe's task source supplies (`TaskSource.supervised_batches`: the RL prompt
stream with held-out prompts excluded, or the training pool with one solution
each, as the task defines it), and stops at the time budget. The loss is the char-level
LM's (tpu_pipeline.train.tasks.char_lm.lm_loss_sum); a NaN/inf loss stops it
with the training core's DivergedError, as in train and rl.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from tpu_pipeline.errors import DivergedError, UserError
from tpu_pipeline.rl.data import build_source
from tpu_pipeline.rl.evaluate import evaluate
from tpu_pipeline.rl.policy import build_optimizer, load_policy
from tpu_pipeline.rl.recipe import RLConfig
from tpu_pipeline.rl.rewards import GuardedReward, load_reward
from tpu_pipeline.train.tasks import char_lm
from tpu_pipeline.train.tasks.base import TaskSource


def supervised_steps(model, opt, batch, seconds: float, warm_start) -> tuple[int, float]:
    """Supervised steps on `batch(step) -> (ids, labels)` for `seconds` of wall time: the
    control every RL recipe is compared with. Returns (steps, seconds trained)."""
    t0, steps = time.time(), 0
    model.train()
    while time.time() - t0 < seconds:
        ids, labels = batch(steps)
        loss = char_lm.lm_loss_sum(model, ids, labels) / (labels != char_lm.IGNORE).sum()
        if not torch.isfinite(loss):
            raise DivergedError(f"diverged: the supervised control's loss became NaN/inf at step {steps + 1}; "
                                f"the warm start in {warm_start} is unchanged; try a lower lr (bench/rl.py control --lr)")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        steps += 1
    return steps, time.time() - t0


def supervised_control(cfg: RLConfig, warm_start_dir: str | Path, seconds: float, *, lr: float = 1e-4,
                       batch_size: int = 64, k: int = 0) -> dict:
    ws = Path(warm_start_dir)
    model, tok = load_policy(ws / "hf")
    opt, carried = build_optimizer(model, lr=lr, weight_decay=0.0, carry_from=ws / "optimizer.pt")
    source = build_source(cfg.data, cfg.trainer.seed)
    if not isinstance(source, TaskSource):
        raise UserError(f"recipe {cfg.name}: the supervised control needs a task source (data.source), not a file")
    heldout = source.heldout()
    batch = source.supervised_batches(tok, batch_size, cfg.trainer.seed)
    guard = GuardedReward(load_reward(cfg.trainer.reward), cfg.trainer.reward_timeout_s)
    try:
        steps, trained = supervised_steps(model, opt, batch, seconds, ws)
        d = cfg.data
        res = evaluate(model, tok, heldout, lambda items: guard(items).scores, max_prompt_length=d.max_prompt_length,
                       max_response_length=d.max_response_length, overlong=d.overlong_prompt, k=k,
                       temperature=cfg.trainer.eval_temperature)
    finally:
        guard.close()
    return {**res, "steps": steps, "seconds_trained": round(trained, 1), "lr": lr, "batch_size": batch_size,
            "optimizer_state_carried": carried}
