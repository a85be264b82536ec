"""Recipe files: the TOML configs shipped under train/recipes and rl/recipes.

A recipe is named by its file stem, or given as a path to a copy the user
edited. Each file has a top-level `description` shown by `tpu-pipeline recipes`.
"""

from __future__ import annotations

import importlib.resources
import tomllib
from pathlib import Path

from tpu_pipeline.errors import UserError

STAGES = ("train", "rl")


def recipe_dir(stage: str) -> Path:
    return Path(str(importlib.resources.files(f"tpu_pipeline.{stage}"))) / "recipes"


def recipe_names(stage: str) -> list[str]:
    d = recipe_dir(stage)
    return sorted(p.stem for p in d.glob("*.toml")) if d.is_dir() else []


def find_recipe(stage: str, name: str) -> Path:
    """A shipped recipe by name, or a user's TOML file by path."""
    if name.endswith(".toml") or "/" in name:
        path = Path(name)
        if not path.is_file():
            raise UserError(f"recipe file not found: {path}")
        return path
    path = recipe_dir(stage) / f"{name}.toml"
    if not path.is_file():
        valid = ", ".join(recipe_names(stage)) or "(none yet)"
        raise UserError(f"unknown {stage} recipe {name!r}; valid: {valid} (or a path to a .toml file)")
    return path


def list_recipes() -> list[dict]:
    """Every shipped recipe: stage, name, description and expected cost, the cost from the
    recipe's own `expected_minutes_cpu` / `expected_minutes_gpu` fields (0 or absent: not
    measured; rl costs include the warm start on a fresh cache)."""
    rows = []
    for stage in STAGES:
        for name in recipe_names(stage):
            data = tomllib.loads((recipe_dir(stage) / f"{name}.toml").read_text())
            rows.append({"stage": stage, "name": name, "description": data.get("description", ""),
                         "expected_minutes_cpu": float(data.get("expected_minutes_cpu") or 0.0) or None,
                         "expected_minutes_gpu": float(data.get("expected_minutes_gpu") or 0.0) or None})
    return rows


def cost_text(row: dict) -> str:
    """"~8 min CPU" (2 cores), with the GPU figure where one was measured; "?" when none is known."""
    parts = []
    if row.get("expected_minutes_cpu"):
        parts.append(f"~{row['expected_minutes_cpu']:g} min CPU")
    if row.get("expected_minutes_gpu"):
        parts.append(f"~{row['expected_minutes_gpu']:g} min GPU")
    return ", ".join(parts) or "?"
