"""Run checkpoints for train and rl: atomic, checksummed, refused when foreign or corrupt.

Layout under DIR/checkpoints/:
    step_000100.pt    torch.save of {format, step, config, <state>...}
    latest.json       {"file", "step", "sha256"}: written after the checkpoint, atomically

<state> is what the loop needs to continue bit-exactly: train saves model,
optimizer and scheduler; rl saves model, optimizer and its counters.

A checkpoint is only ever trusted through latest.json: a crash between the
two writes leaves the previous checkpoint as the latest. Loading checks the
sha256, the format tag and that the run config matches this run's, and
loads with weights_only=True (no code from the file runs).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import torch

from tpu_pipeline.errors import UserError
from tpu_pipeline.files import atomic_write_bytes, atomic_write_json, sha256_file

FORMAT = "tpu-pipeline/train-checkpoint@1"
_RESERVED = ("format", "step", "config")


class Checkpointer:
    """save(step, config=..., state=...) / load(config) over DIR/checkpoints.

    keep: checkpoints kept on disk (the latest and keep-1 before it).
    resume_hint: what the user should keep equal, said when configs differ.
    """

    def __init__(self, run_dir: str | Path, *, keep: int = 2,
                 resume_hint: str = "resume with the same recipe and overrides, or use another --out"):
        self.dir = Path(run_dir) / "checkpoints"
        self.keep = max(1, keep)
        self.resume_hint = resume_hint

    @property
    def latest_path(self) -> Path:
        return self.dir / "latest.json"

    def exists(self) -> bool:
        return self.latest_path.exists()

    def save(self, step: int, *, config: dict, state: dict[str, Any]) -> Path:
        clash = [k for k in state if k in _RESERVED]
        if clash:
            raise ValueError(f"checkpoint state may not use the reserved key {clash[0]!r}")
        obj = {"format": FORMAT, "step": step, "config": config, **state}
        buf = io.BytesIO()
        torch.save(obj, buf)
        path = self.dir / f"step_{step:06d}.pt"
        atomic_write_bytes(path, buf.getvalue())
        atomic_write_json(self.latest_path, {"file": path.name, "step": step, "sha256": sha256_file(path)})
        self._prune(keep=path)
        return path

    def load(self, config: dict) -> dict[str, Any]:
        """The latest checkpoint, checked; UserError (nothing changed) when it cannot be used."""
        if not self.exists():
            raise UserError(f"--resume: no checkpoint in {self.dir} (expected {self.latest_path.name})")
        try:
            latest = json.loads(self.latest_path.read_text())
            path = self.dir / latest["file"]
            want = latest["sha256"]
        except (ValueError, KeyError, TypeError):
            raise UserError(f"--resume: {self.latest_path} is corrupt (not the JSON a checkpoint index holds)") from None
        if Path(latest["file"]).name != latest["file"]:
            raise UserError(f"--resume: {self.latest_path} points outside {self.dir}")
        if not path.is_file():
            raise UserError(f"--resume: checkpoint {path} listed in {self.latest_path.name} is missing")
        got = sha256_file(path)
        if got != want:
            raise UserError(f"--resume: checkpoint {path} is corrupt (sha256 {got[:12]}... != recorded {want[:12]}...)")
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unpickling failure means the file is not ours
            raise UserError(f"--resume: {path} is not a loadable checkpoint ({type(e).__name__})") from None
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise UserError(f"--resume: {path} is not a tpu-pipeline training checkpoint")
        diff = first_difference(obj.get("config"), config)
        if diff:
            raise UserError(f"--resume: {path} was written by a different config ({diff}); {self.resume_hint}")
        return obj

    def _prune(self, keep: Path) -> None:
        ckpts = sorted(self.dir.glob("step_*.pt"))
        for p in ckpts[:-self.keep]:
            if p != keep:
                p.unlink(missing_ok=True)


def first_difference(a: Any, b: Any, path: str = "") -> str:
    """'key.path: checkpoint has X, this run Y' for the first differing leaf, '' when equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            d = first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else k)
            if d:
                return d
        return ""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        a, b = list(a), list(b)  # JSON and torch.load give lists where the config has tuples
    if a != b:
        return f"{path or 'config'}: checkpoint has {a!r}, this run {b!r}"
    return ""
