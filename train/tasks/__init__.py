"""The tasks layer (tpu_pipeline.train.tasks): each task in one module, below train and rl.

    from tpu_pipeline.train.tasks import TASKS, TASK_SOURCES, REWARDS
    TASKS.get("arith_lm")          # the supervised train Task
    TASK_SOURCES.get("arith")      # the rl source of the same problems
    REWARDS.get("countdown")       # a task's verifier as an rl reward

A task module (arith.py, countdown.py, digits.py, gsm8k.py) holds the task's
problems and difficulty, prompt format and verifier, and registers its train
Task, rl TaskSource and reward where they are defined (base.py). Shared pieces:
rows.py (VeRL's row schema, the stable seed), char_lm.py (the char-level
Llama the text tasks train), rewards.py (VeRL's scorer by data source).

Adding a task is one module here and its recipe files: importing this package
imports every module in it, so there is no list of task modules to keep.
"""

import importlib
import pkgutil

from tpu_pipeline.train.tasks.base import REWARDS, TASK_SOURCES, TASKS

for _m in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_m.name}")

__all__ = ["REWARDS", "TASKS", "TASK_SOURCES"]
