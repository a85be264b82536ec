"""The tasks layer: every task registers itself where it is defined, the shipped
recipes name registered tasks, and the generic code of train and rl names none."""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tpu_pipeline.recipes import recipe_dir
from tpu_pipeline.train.tasks import REWARDS, TASK_SOURCES, TASKS, arith, gsm8k
from tpu_pipeline.train.tasks.base import Task, TaskSource

ROOT = Path(__file__).resolve().parents[2]
# train's and rl's machinery: it looks tasks up by the name a recipe gives, never says one.
GENERIC = [*(ROOT / "train").glob("*.py"), *(ROOT / "rl").glob("*.py")]


def _task_words() -> set[str]:
    words = set(TASKS.names()) | {TASKS.get(n).section for n in TASKS} | set(TASK_SOURCES.names())
    words |= {n for n in REWARDS.names() if n != "verl_default"}
    return words | set(arith.GYM_TASKS) | {gsm8k.SYMBOLIC, "gsm8k", "arith"}


def test_every_task_is_registered_with_its_typed_section():
    assert {"arith_lm", "countdown_lm", "digits_cnn"} <= set(TASKS.names())
    sections = [TASKS.get(n).section for n in TASKS]
    assert len(sections) == len(set(sections))  # one recipe table, one task
    for name in TASKS:
        cls = TASKS.get(name)
        assert issubclass(cls, Task) and dataclasses.is_dataclass(cls.Config)
        assert TASKS.entry(name).defined_in.startswith("tpu_pipeline.train.tasks.")
    for name in TASK_SOURCES:
        src = TASK_SOURCES.get(name)
        assert issubclass(src, TaskSource) and dataclasses.is_dataclass(src.Options)
    assert {"arith", "countdown"} <= set(TASK_SOURCES.names())
    assert {"countdown", "verl_default"} <= set(REWARDS.names())


def test_shipped_recipes_name_registered_tasks_sources_and_rewards():
    import tomllib

    for path in recipe_dir("train").glob("*.toml"):
        data = tomllib.loads(path.read_text())
        assert data["task"] in TASKS and TASKS.get(data["task"]).section in data, path.name
    for path in recipe_dir("rl").glob("*.toml"):
        data = tomllib.loads(path.read_text())
        assert data["data"]["source"] in TASK_SOURCES or data["data"]["file"], path.name
        assert data["trainer"]["reward"] in REWARDS, path.name


@pytest.mark.parametrize("path", GENERIC, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_generic_code_names_no_task(path):
    """No string constant (docstrings aside: they may show a recipe as an example), name
    or import in train's and rl's generic modules is a task's name."""
    words = _task_words()
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found += [w for w in re.split(r"[^A-Za-z0-9_]+", node.value) if w in words]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [getattr(node, "module", None) or ""] + [a.name for a in node.names]
            found += [w for m in mods for w in words if w in m.split(".")]
        elif isinstance(node, (ast.Name, ast.Attribute)):
            found += [w for w in words if (node.id if isinstance(node, ast.Name) else node.attr) == w]
    assert not found, f"{path.relative_to(ROOT)} names {sorted(set(found))}"


def test_importing_train_stays_cheap():
    code = "import sys, tpu_pipeline.train; print('transformers' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
