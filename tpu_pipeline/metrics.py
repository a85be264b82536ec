"""Where training figures go: DIR/metrics.jsonl, TensorBoard events, a progress bar.

Only the main process writes. On resume, rows after the checkpoint's step
are dropped (they are about to be recomputed) and TensorBoard purges them.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from ..files import append_jsonl, atomic_write_text


class MetricsWriter:
    def __init__(self, out: Path, *, total_steps: int, start_step: int, enabled: bool = True,
                 progress: bool | None = None, description: str = "train"):
        self.enabled = enabled
        self.path = Path(out) / "metrics.jsonl"
        self.total = total_steps
        self._tb = None
        self._bar = None
        self._last_line = 0.0
        if not enabled:
            return
        self._truncate(start_step)
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(Path(out) / "tb"), purge_step=start_step + 1)
        except ImportError:  # tensorboard missing: metrics.jsonl still has everything
            self._tb = None
        if progress is None:
            progress = sys.stderr.isatty()
        if progress:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeRemainingColumn(), transient=False)
            self._bar.start()
            self._task = self._bar.add_task(description, total=total_steps, completed=start_step, info="")

    def _truncate(self, start_step: int) -> None:
        if not self.path.exists():
            return
        if start_step == 0:
            self.path.unlink()
            return
        keep = []
        for line in self.path.read_text().splitlines():
            try:
                if json.loads(line).get("step", 0) <= start_step:
                    keep.append(line)
            except ValueError:
                break  # a torn last line from a killed run
        atomic_write_text(self.path, "".join(k + "\n" for k in keep))

    def log(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        append_jsonl(self.path, row)
        step = row["step"]
        if self._tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)):
                    self._tb.add_scalar(f"train/{k}" if not k.startswith("eval/") else k, v, step)
        info = f"loss {row['loss']:.4f}  {row.get('samples_per_s', 0):.0f} samples/s" if "loss" in row else ""
        if self._bar is not None:
            self._bar.update(self._task, completed=step, info=info)
        elif info and (time.monotonic() - self._last_line > 5 or step == self.total):
            self._last_line = time.monotonic()
            print(f"step {step}/{self.total}  {info}", file=sys.stderr, flush=True)

    def advance(self, step: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=step)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
        if self._tb is not None:
            self._tb.close()
