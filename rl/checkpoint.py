"""Step checkpoints: DIR/checkpoints/step_NNNNNN/{state.pt, trainer.json}.

Every random draw of a step comes from generators seeded by (seed, step), so
model + optimizer + step counters are all a resumed run needs to reproduce
the uninterrupted one. Folders are staged and renamed: a killed save leaves
no half checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from ..files import atomic_write_json, staged_dir


def ckpt_dir(out: Path) -> Path:
    return out / "checkpoints"


def save(out: Path, step: int, model, optimizer, trainer_state: dict, keep: int) -> Path:
    final = ckpt_dir(out) / f"step_{step:06d}"
    with staged_dir(final) as stage:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, stage / "state.pt")
        atomic_write_json(stage / "trainer.json", {**trainer_state, "step": step})
    for old in sorted(ckpt_dir(out).glob("step_*"))[:-max(keep, 1)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(out: Path) -> Path | None:
    done = [d for d in sorted(ckpt_dir(out).glob("step_*")) if (d / "trainer.json").is_file()]
    return done[-1] if done else None


def load(path: Path, model, optimizer) -> dict:
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return json.loads((path / "trainer.json").read_text())
