"""What a recipe trains: data, model, loss, evaluation and export, per task.

The loop (loop.py) is task-agnostic; it asks a `Task` for a batch of given
sample indices, the summed loss of a batch and the count it is averaged
over (samples or target tokens), so that data-parallel shards sum to
exactly the single-process mean.

A task module (digits.py, arith_lm.py) subclasses `Task` and registers it
with `@TASKS.register(name)`; runner.py imports every task module, so this
module never imports them (no cycle).
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any

import torch

from tpu_pipeline.registry import Registry
from tpu_pipeline.train.recipe import Recipe

TASKS: Registry[type["Task"]] = Registry("train task")


class Task(abc.ABC):
    """Base class; subclasses register with `@TASKS.register(name)` and implement every abstract method."""

    def __init__(self, recipe: Recipe, recipe_name: str):
        self.recipe = recipe
        self.recipe_name = recipe_name

    num_train: int = 0

    @abc.abstractmethod
    def build_model(self) -> torch.nn.Module:
        ...

    @abc.abstractmethod
    def make_batch(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """Batch of the training samples `idx` (CPU tensors)."""
        ...

    @abc.abstractmethod
    def count(self, batch: dict[str, torch.Tensor]) -> int:
        """Units the loss is averaged over (samples or target tokens)."""
        ...

    @abc.abstractmethod
    def loss_sum(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        ...

    @abc.abstractmethod
    def evaluate(self, model: torch.nn.Module, device: torch.device) -> dict[str, Any]:
        ...

    @abc.abstractmethod
    def export(self, model: torch.nn.Module, out: Path, *, optimizer: torch.optim.Optimizer,
               metrics: dict[str, Any]) -> None:
        ...

    @abc.abstractmethod
    def flops_per_sample(self, model: torch.nn.Module) -> float:
        """Training FLOPs (forward + backward) per sample, for throughput figures."""
        ...
