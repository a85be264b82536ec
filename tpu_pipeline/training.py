"""What train's loop (train/loop.py) and rl's engine (rl/engine.py) share
beside checkpoints (checkpoint.py), metrics (metrics.py) and the learning-rate
schedule (schedule.py): the hook signature and the divergence error.

Hooks: `hook(step, row)` after every optimizer step, once that step's metrics
row is logged and its checkpoint (if any) is written. `step` counts finished
steps (1-based); `row` is the step's metrics row, or `{"step": step}` when
the step logged nothing. A hook observes, or stops the run by raising.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

from tpu_pipeline.errors import DivergedError

Hook = Callable[[int, dict], None]


def call_hooks(hooks: Iterable[Hook], step: int, row: dict | None) -> None:
    for hook in hooks:
        hook(step, row if row is not None else {"step": step})


def diverged(what: str, *, checkpoint_dir: Path, last_good: int | None, lr_key: str) -> DivergedError:
    """The one-line error of a run whose loss or gradients became NaN/inf.

    what: what went non-finite and at which step, e.g. "the loss became NaN/inf at step 8".
    """
    if last_good is None:
        kept = "no checkpoint was written before it"
    else:
        kept = f"the last good checkpoint (step {last_good}) is kept in {checkpoint_dir}"
    return DivergedError(f"diverged: {what}; {kept}; try a lower learning rate "
                         f"(--set {lr_key}=...) or another --seed")
