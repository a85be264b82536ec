"""Where an rl run's prompts come from: a task's registered source, or a VeRL parquet file.

- a task source (`data.source`, registered in tpu_pipeline.train.tasks'
  TASK_SOURCES by the task's own module): the task's problems in the warm
  start's own format, a fixed held-out split and training batches that never
  contain a held-out prompt;
- ParquetSource (`data.file`): a file made by VeRL's preprocessing scripts
  (GSM8K, MATH...), validated row by row; a fixed held-out split by seeded
  permutation.

Both yield rows in VeRL's schema (tpu_pipeline.train.tasks.rows.Problem), so
the local engine and `--engine verl` read the same thing.
"""

from __future__ import annotations

import random
from pathlib import Path

from tpu_pipeline.errors import UserError
from tpu_pipeline.train.tasks import TASK_SOURCES
from tpu_pipeline.train.tasks.rows import Problem, read_parquet, stable_seed


class ParquetSource:
    """Rows of a VeRL parquet file; the last `heldout_n` of a seeded permutation are held out."""

    def __init__(self, path: str | Path, heldout_n: int, seed: int = 0):
        self.path = Path(path)
        self.problems = read_parquet(self.path)
        order = list(range(len(self.problems)))
        random.Random(stable_seed("split", seed)).shuffle(order)
        k = min(heldout_n, len(order) // 10) if len(order) >= 10 else 0
        self._heldout = [self.problems[i] for i in order[len(order) - k:]] if k else []
        self._train = [self.problems[i] for i in order[: len(order) - k]]
        if not self._train:
            raise UserError(f"{self.path}: no training rows")

    def heldout(self) -> list[Problem]:
        if not self._heldout:
            raise UserError(f"{self.path}: too few rows for a held-out split (need >= 10)")
        return self._heldout

    def fresh(self, n: int, seed: int) -> list[Problem]:
        rng = random.Random(stable_seed("fresh", seed))
        return rng.sample(self.problems, min(n, len(self.problems)))

    def train_batch(self, step: int, n: int, seed: int) -> list[Problem]:
        # Epochs over a seeded permutation: the batch of a step depends only on (seed, step).
        per_epoch = max(1, len(self._train) // n)
        epoch, pos = divmod(step, per_epoch)
        order = list(range(len(self._train)))
        random.Random(stable_seed("epoch", seed, epoch)).shuffle(order)
        idx = [order[(pos * n + i) % len(order)] for i in range(n)]
        return [self._train[i] for i in idx]


# Parquet files shipped inside the package (grpo_gsm8k's offline problems): a recipe or
# --data names one by its bare file name.
DATASETS = Path(__file__).parent / "datasets"


def resolve_data_file(file: str | Path) -> Path:
    """`file` as given when it exists; else, for a bare file name, the shipped dataset of that name."""
    path = Path(file)
    if not path.exists() and path.name == str(file) and (DATASETS / path.name).is_file():
        return DATASETS / path.name
    return path


def build_source(data_cfg, seed: int, file: str = ""):
    """The source of `data_cfg`: its file when one is given, else its registered task source."""
    file = file or data_cfg.file
    if file:
        return ParquetSource(resolve_data_file(file), data_cfg.heldout_n, seed)
    if not data_cfg.source:
        raise UserError("rl data: set data.source (a task source: " + ", ".join(TASK_SOURCES.names())
                        + ") or data.file (--data FILE.parquet)")
    return TASK_SOURCES.get(data_cfg.source).from_config(data_cfg, seed)
