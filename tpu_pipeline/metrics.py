"""Where a run's figures go, for train and rl alike: DIR/metrics.jsonl (one
JSON object per logged step), TensorBoard events under DIR/tb, and a
progress bar (or a line every few seconds when stderr is not a terminal).

Only the main process writes. On resume, rows after the checkpoint's step
are dropped (they are about to be recomputed) and TensorBoard purges them.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

from tpu_pipeline.files import append_jsonl, atomic_write_text

# (label, row key, format) of the figures shown beside the progress bar.
Field = tuple[str, str, str]
TRAIN_FIELDS: tuple[Field, ...] = (("loss", "loss", "{:.4f}"), ("samples/s", "samples_per_s", "{:.0f}"))


class MetricsWriter:
    """log(row) appends a row {"step": n, ...}; advance(step) moves the bar only.

    tb_prefix: TensorBoard tag prefix of plain keys ("train/loss"); keys that
    already name a group ("eval/accuracy", "a.b" -> "a/b") keep it.
    lines: without a bar, print a status line to stderr every 5 s.
    """

    def __init__(self, out: str | Path, *, total_steps: int, start_step: int, enabled: bool = True,
                 progress: bool | None = None, description: str = "train", tb_prefix: str = "train",
                 fields: Sequence[Field] = TRAIN_FIELDS, lines: bool = True):
        self.enabled = enabled
        self.path = Path(out) / "metrics.jsonl"
        self.total = total_steps
        self.tb_prefix = tb_prefix
        self.fields = tuple(fields)
        self.lines = lines
        self._tb = None
        self._bar = None
        self._last_line = 0.0
        if not enabled:
            return
        self._truncate(start_step)
        try:
            # heavy: tensorboard's writer pulls in protobuf and numpy event code
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(Path(out) / "tb"), purge_step=start_step + 1)
        except ImportError:  # tensorboard missing: metrics.jsonl still has everything
            self._tb = None
        if progress is None:
            progress = sys.stderr.isatty()
        if progress:
            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
                                 transient=False)
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

    def _tag(self, key: str) -> str:
        if "/" in key or "." in key:
            return key.replace(".", "/")
        return f"{self.tb_prefix}/{key}" if self.tb_prefix else key

    def log(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        append_jsonl(self.path, row)
        step = row["step"]
        if self._tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)):
                    self._tb.add_scalar(self._tag(k), v, step)
        info = "  ".join(f"{label} {fmt.format(row[key])}" for label, key, fmt in self.fields
                         if isinstance(row.get(key), (int, float)))
        if self._bar is not None:
            self._bar.update(self._task, completed=step, info=info)
        elif self.lines and info and (time.monotonic() - self._last_line > 5 or step == self.total):
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


def read_metrics(path: str | Path) -> list[dict]:
    """The rows of a metrics.jsonl."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
