"""Training recipe schema: typed keyword-only dataclasses filled from TOML.

A recipe file (train/recipes/*.toml) names a registered `task` and holds the
shared `[loop]` and `[optim]` sections plus the task's own table, named and
typed by the task (`Task.section` names the table, `Task.Config` types it).
Every field is documented in the shipped recipes; `tpu_pipeline.config`
rejects unknown keys and wrong types, and `validate` below rejects values
that type check but cannot work.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from tpu_pipeline import config
from tpu_pipeline.errors import UserError
from tpu_pipeline.train.tasks import TASKS

@dataclasses.dataclass(kw_only=True)
class LoopConfig:
    steps: int                       # optimizer steps of the whole run
    batch_size: int                  # global batch (split across --nproc processes)
    log_every: int = 10              # steps between metrics.jsonl / TensorBoard rows
    checkpoint_every: int = 0        # steps between checkpoints (0: only the last step)
    eval_every: int = 0              # steps between held-out evaluations (0: only at the end)
    compile: bool = False            # torch.compile the model (--compile/--no-compile override)
    bf16: bool = True                # bf16 autocast where the device has native bf16


@dataclasses.dataclass(kw_only=True)
class OptimConfig:
    lr: float                        # peak learning rate
    weight_decay: float = 0.0        # AdamW decoupled weight decay
    betas: list[float] = dataclasses.field(default_factory=lambda: [0.9, 0.999])  # AdamW betas
    eps: float = 1e-8                # AdamW epsilon
    warmup_steps: int = 0            # linear warm-up from 0 to lr
    min_lr_ratio: float = 0.1        # cosine decays to lr * min_lr_ratio at the last step
    grad_clip: float = 1.0           # max global gradient norm (0: no clipping)


@dataclasses.dataclass(kw_only=True)
class Recipe:
    description: str                 # one line shown by `tpu-pipeline recipes`
    task: str                        # a registered train task (tpu_pipeline.train.tasks.TASKS)
    seed: int = 0                    # run seed: init, batch order, dropout (--seed overrides)
    loop: LoopConfig
    optim: OptimConfig
    expected_minutes_cpu: float = 0.0   # wall minutes of the default run on 2 CPU cores (tpu-pipeline recipes; 0: not measured)
    expected_minutes_gpu: float = 0.0   # the same on one GPU (0: not measured)
    # The task's table ([<Task.section>]), typed by its Task.Config; filled by `load`, not a TOML key.
    settings: Any = dataclasses.field(default=None, init=False)

    @property
    def section(self) -> str:
        return TASKS.get(self.task).section


def load(path: Path, overrides: dict[str, Any] | None = None) -> Recipe:
    """The recipe at `path` with dotted overrides, its task's table typed by the task."""
    data, _ = config.read(path, overrides)
    task = data.get("task")
    if not isinstance(task, str):
        raise UserError(f"{path}: task: expected a registered train task name, got {task!r}")
    cls = TASKS.get(task)
    section = data.pop(cls.section, {})
    for entry in TASKS.entries():
        if entry.obj.section in data and entry.obj.section != cls.section:
            raise UserError(f"{path}: section [{entry.obj.section}] belongs to task {entry.name!r}, but task is {task!r}")
    r = config.build(Recipe, data, str(path))
    r.settings = config.build(cls.Config, section, f"{path}: {cls.section}")
    return r


def fingerprint(r: Recipe) -> dict:
    """What a checkpoint must agree with to be resumed (everything that shapes the losses),
    in the shape of the recipe file."""
    d = dataclasses.asdict(r)
    d.pop("description", None)
    d[r.section] = d.pop("settings")
    for k in ("log_every", "eval_every", "checkpoint_every", "compile"):
        d["loop"].pop(k, None)
    return d


def validate(r: Recipe, where: str) -> Recipe:
    """Values that type check but cannot train; each a one-line UserError."""

    def bad(msg: str) -> None:
        raise UserError(f"{where}: {msg}")

    L, O = r.loop, r.optim
    if L.steps < 1:
        bad(f"loop.steps must be >= 1, got {L.steps}")
    if L.batch_size < 1:
        bad(f"loop.batch_size must be >= 1, got {L.batch_size}")
    for k in ("log_every",):
        if getattr(L, k) < 1:
            bad(f"loop.{k} must be >= 1, got {getattr(L, k)}")
    for k in ("checkpoint_every", "eval_every"):
        if getattr(L, k) < 0:
            bad(f"loop.{k} must be >= 0, got {getattr(L, k)}")
    if not O.lr > 0:
        bad(f"optim.lr must be > 0, got {O.lr}")
    if O.weight_decay < 0:
        bad(f"optim.weight_decay must be >= 0, got {O.weight_decay}")
    if len(O.betas) != 2 or not all(0 <= b < 1 for b in O.betas):
        bad(f"optim.betas must be two numbers in [0, 1), got {O.betas}")
    if O.warmup_steps < 0:
        bad(f"optim.warmup_steps must be >= 0, got {O.warmup_steps}")
    if not 0 <= O.min_lr_ratio <= 1:
        bad(f"optim.min_lr_ratio must be in [0, 1], got {O.min_lr_ratio}")
    if O.grad_clip < 0:
        bad(f"optim.grad_clip must be >= 0, got {O.grad_clip}")
    if r.seed < 0:
        bad(f"seed must be >= 0, got {r.seed}")
    try:
        r.settings.check(r.section)
    except UserError as e:
        bad(str(e))
    return r
