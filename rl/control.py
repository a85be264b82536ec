"""The supervised control for grpo_math's report: the same warm start, the same
held-out split, and the RL phase's wall time spent on more supervised steps
on the true answers (what the warm start would have gained from more
supervision instead of RL).

It continues the warm start's optimizer (AdamW moments carried) at the
learning rate its schedule ended on, with its batch size, on the RL prompt
stream (held-out prompts excluded), and stops at the time budget.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .config import RLConfig
from .data import ArithSource
from .evaluate import evaluate
from .rewards import GuardedReward, load_reward


def supervised_control(cfg: RLConfig, warm_start_dir: str | Path, seconds: float, *, lr: float = 1e-4,
                       batch_size: int = 64, k: int = 0) -> dict:
    from ..train import arith
    from .policy import build_optimizer, load_policy

    ws = Path(warm_start_dir)
    model, tok = load_policy(ws / "hf")
    opt, carried = build_optimizer(model, lr=lr, weight_decay=0.0, carry_from=ws / "optimizer.pt")
    source = ArithSource(cfg.data.tasks, cfg.data.difficulty, cfg.data.heldout_n)
    heldout = source.heldout()
    guard = GuardedReward(load_reward(cfg.trainer.reward), cfg.trainer.reward_timeout_s)
    score = lambda items: guard(items).scores  # noqa: E731
    pad = tok.pad_token_id
    t0, steps = time.time(), 0
    model.train()
    while time.time() - t0 < seconds:
        probs = source.train_batch(steps, batch_size, cfg.trainer.seed + 7919)
        enc = [arith.encode_example(tok, {"prompt": p.prompt, "answer": p.ground_truth}) for p in probs]
        L = max(len(ids) for ids, _ in enc)
        ids = torch.full((len(enc), L), pad, dtype=torch.long)
        labels = torch.full((len(enc), L), -100, dtype=torch.long)
        for i, (x, n_prompt) in enumerate(enc):
            ids[i, : len(x)] = torch.tensor(x)
            labels[i, n_prompt - 1: len(x) - 1] = torch.tensor(x[n_prompt:])
        logits = model(input_ids=ids, use_cache=False).logits
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        steps += 1
    trained = time.time() - t0
    d = cfg.data
    res = evaluate(model, tok, heldout, score, max_prompt_length=d.max_prompt_length,
                   max_response_length=d.max_response_length, overlong=d.overlong_prompt, k=k,
                   temperature=cfg.trainer.eval_temperature)
    guard.close()
    return {**res, "steps": steps, "seconds_trained": round(trained, 1), "lr": lr, "batch_size": batch_size,
            "optimizer_state_carried": carried}
