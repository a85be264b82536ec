"""The learning-rate schedule train and rl share: linear warm-up, then cosine decay.

rl's grpo_math holds the rate after warm-up (min_ratio=1: the cosine term
vanishes), train decays it to lr * min_lr_ratio at the last step.
"""

from __future__ import annotations

import math

import torch


def lr_factor(step: int, *, total: int, warmup: int, min_ratio: float) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based): linear warm-up, then cosine."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def scheduler(optimizer: torch.optim.Optimizer, *, total: int, warmup: int,
              min_ratio: float) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR stepping `lr_factor` once per optimizer step (its state goes into checkpoints)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, total=total, warmup=warmup, min_ratio=min_ratio))
