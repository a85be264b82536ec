"""Rewards: a registered reward by name, a user's `module:function`, and a guard
that bounds each call with a timeout so a reward that raises or hangs costs one
sample, not the run.

The built-in rewards are registered in tpu_pipeline.train.tasks' REWARDS,
each beside the task it verifies, or in that package's rewards module for
`verl_default` (VeRL's scorer by data source, strict `#### N` otherwise). A
user's reward is any function with VeRL's compute_score signature, named as
`module:function`. `--engine verl` hands VeRL the same function.
"""

from __future__ import annotations

import importlib
import math
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from tpu_pipeline.errors import UserError
from tpu_pipeline.train.tasks import REWARDS

DEFAULT_REWARD = "verl_default"


def load_reward(spec: str) -> Callable[..., Any]:
    """A registered reward's name, or `module:function` -> the function (imported, never exec'd from a file)."""
    if ":" not in spec:
        if spec in REWARDS:
            return REWARDS.get(spec)
        raise UserError(f"--reward {spec!r}: not a registered reward ({', '.join(REWARDS.names())}) "
                        f"nor module:function (e.g. my_rewards:compute_score)")
    mod_name, fn_name = spec.split(":", 1)
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise UserError(f"--reward {spec!r}: cannot import {mod_name!r} ({e})") from None
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise UserError(f"--reward {spec!r}: {mod_name} has no function {fn_name!r}")
    return fn


def reward_location(spec: str) -> tuple[str, str]:
    """(module, function) of a reward spec: what VeRL's custom_reward_function imports."""
    if ":" in spec:
        mod, fn = spec.split(":", 1)
        return mod, fn
    fn = load_reward(spec)
    return fn.__module__, fn.__name__


@dataclass
class ScoreReport:
    scores: list[float]
    errors: int = 0
    timeouts: int = 0
    first_error: str = ""
    notes: list[str] = field(default_factory=list)


class GuardedReward:
    """Calls `fn(data_source, solution_str, ground_truth, extra_info)` in a worker
    thread, waiting at most `timeout_s` per call.

    A call that raises or returns a non-finite value scores 0 and is counted as
    an error; a call that overruns scores 0, is counted as a timeout, and its
    worker is abandoned (a daemon thread: Python cannot kill it) so the next
    call runs on a fresh one.
    """

    def __init__(self, fn: Callable[..., Any], timeout_s: float = 5.0):
        self.fn = fn
        self.timeout_s = float(timeout_s)
        self._jobs: queue.Queue | None = None

    def _start_worker(self) -> None:
        jobs: queue.Queue = queue.Queue()
        self._jobs = jobs

        def work():
            while True:
                item = jobs.get()
                if item is None:
                    return
                args, out = item
                try:
                    out.put(("ok", self.fn(*args)))
                except BaseException as e:  # noqa: BLE001 - a user's reward may raise anything
                    out.put(("error", f"{type(e).__name__}: {e}"))

        threading.Thread(target=work, name="reward-worker", daemon=True).start()

    def __call__(self, items: list[tuple[str, str, str, Any]]) -> ScoreReport:
        report = ScoreReport(scores=[])
        for args in items:
            if self._jobs is None:
                self._start_worker()
            out: queue.Queue = queue.Queue(maxsize=1)
            self._jobs.put((args, out))
            try:
                kind, value = out.get(timeout=self.timeout_s)
            except queue.Empty:
                report.timeouts += 1
                report.scores.append(0.0)
                self._jobs = None  # abandon the stuck worker
                continue
            if kind == "error":
                report.errors += 1
                report.first_error = report.first_error or value
                report.scores.append(0.0)
                continue
            if isinstance(value, dict):
                value = value.get("score", 0.0)
            try:
                value = float(value)
            except (TypeError, ValueError):
                value = float("nan")
            if not math.isfinite(value):
                report.errors += 1
                report.first_error = report.first_error or f"non-finite reward {value!r}"
                value = 0.0
            report.scores.append(value)
        return report

    def close(self) -> None:
        if self._jobs is not None:
            self._jobs.put(None)
            self._jobs = None
