"""What a task is to train and to rl, and the registries they are found in.

A task module (train/tasks/<name>.py) holds everything about one task: its
problems and difficulty, prompt format, verifier, its typed recipe section,
the supervised `Task` train runs, and the `TaskSource` rl draws prompts
from. Each registers where it is defined:

    @TASKS.register("arith_lm")
    class ArithTask(Task): ...

    @TASK_SOURCES.register("arith")
    class ArithSource(TaskSource): ...

    @REWARDS.register("countdown")
    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw): ...

`tpu_pipeline.train.tasks` imports every module of the package, so the
registries are complete as soon as any of it is imported; generic code
(train's runner and loop, everything in rl) looks tasks up by the name a
recipe gives and never names one itself.

The loop (train/loop.py) asks a `Task` for a batch of given sample indices,
the summed loss of a batch and the count it is averaged over (samples or
target tokens), so that data-parallel shards sum to exactly the
single-process mean.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any, Callable, ClassVar

import torch

from tpu_pipeline import config
from tpu_pipeline.errors import UserError
from tpu_pipeline.registry import Registry
from tpu_pipeline.train.tasks.rows import Problem

TASKS: Registry[type["Task"]] = Registry(
    "train task", "a Task subclass in train/tasks/<task>.py with @TASKS.register(name), and a recipe "
                  "train/recipes/<name>.toml whose [<Task.section>] table its Config types")
TASK_SOURCES: Registry[type["TaskSource"]] = Registry(
    "rl task source", "a TaskSource subclass in train/tasks/<task>.py with @TASK_SOURCES.register(name); "
                      "an rl recipe names it as data.source")
REWARDS: Registry[Callable[..., Any]] = Registry(
    "rl reward", "a function (data_source, solution_str, ground_truth, extra_info) -> float with "
                 "@REWARDS.register(name), beside the task it verifies; recipes name it as trainer.reward "
                 "(or any module:function)")


class Task(abc.ABC):
    """Base class of a supervised train task; subclasses register with `@TASKS.register(name)`."""

    # The recipe table that holds this task's settings ("arith": `[arith]`), typed by `Config`
    # (a keyword-only dataclass: unknown keys and wrong types are refused, `check` refuses bad values).
    section: ClassVar[str]
    Config: ClassVar[type]
    # Whether `--kernels` routes the model's attention and RMSNorm (tpu_pipeline.kernels.use_kernels).
    uses_kernels: ClassVar[bool] = False

    def __init__(self, config: Any, *, seed: int, recipe_name: str):
        self.config = config
        self.seed = seed
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


class TaskSource(abc.ABC):
    """Base class of an rl data source: prompts with verifiable answers as VeRL rows.

    Built from an rl recipe's `[data]` table by `from_config`: `data.difficulty` is typed
    by the source's `Difficulty`, `data.options` by its `Options` (unknown keys refused).
    The held-out split is fixed (it does not move with the seed), and `train_batch`
    never returns a held-out prompt.
    """

    Difficulty: ClassVar[type]  # with from_dict (a recipe's table, unknown keys refused)
    Options: ClassVar[type]     # a keyword-only dataclass

    @classmethod
    def options(cls, data_cfg: Any) -> Any:
        """`data.options` typed by `Options`; a source adds its own value checks."""
        return config.build(cls.Options, dict(data_cfg.options), "data.options")

    @classmethod
    @abc.abstractmethod
    def from_config(cls, data_cfg: Any, seed: int) -> "TaskSource":
        """From rl's DataConfig; bad difficulty or options are a one-line UserError."""

    @classmethod
    @abc.abstractmethod
    def warm_start_overrides(cls, data_cfg: Any) -> dict[str, Any]:
        """`--set` overrides of the warm start's train recipe that give it this source's task
        and difficulty (so the two cannot drift apart); part of the warm start's cache key."""

    @abc.abstractmethod
    def heldout(self) -> list[Problem]:
        ...

    @abc.abstractmethod
    def fresh(self, n: int, seed: int) -> list[Problem]:
        """Problems from a generator seed of the caller's choice (`eval --seed`)."""

    @abc.abstractmethod
    def train_batch(self, step: int, n: int, seed: int) -> list[Problem]:
        """`n` training prompts for `step`, a function of (seed, step) only, none held out."""

    def unseen(self, n: int, warm_start: Any) -> list[Problem]:
        """Held-out problems the warm start never trained on either, for the report beside the
        main split; `warm_start` is its typed train recipe. [] when the source has no such split."""
        return []

    def supervised_batches(self, tokenizer, batch_size: int, seed: int) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
        """`batch(step) -> (input_ids, labels)` on the true answers, for the supervised control
        every RL recipe is compared with (labels IGNORE outside the answer)."""
        raise UserError(f"rl task source {type(self).__name__} has no supervised control")
