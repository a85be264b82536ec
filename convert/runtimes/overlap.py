"""Targets in threads that take turns: the parent's own work (quantizing, XNNPACK runs, PyTorch
references, latency) runs for one target at a time, and a target that waits on a child process
(Chromium, LiteRT's GPU accelerator, TFLM) hands its turn on, so the child works on one core while
the next target's parent work runs on the other.

One turn at a time keeps what the targets share (cached variants, parity runs and latencies, the
kind's notes) free of races, and keeps latency measurements off each other's core; the lowest rank
waiting is served first, so the order of the parent's work does not depend on thread scheduling.
`waiting()` marks a wait on a child; outside a turn (a plain call, a helper thread) it does nothing.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")

_local = threading.local()


class Cancelled(BaseException):
    """Raised in a target thread at its next turn once the conversion is stopping (another target
    raised, or the caller was interrupted): it starts no more work. A BaseException, as
    KeyboardInterrupt is, so that no stage's catch-all turns it into a result and goes on."""


class Turns:
    """The parent's turn among `n` target threads of ranks 0..n-1, held by one at a time: it goes to
    the lowest rank that is neither waiting on a child nor finished (a thread not yet started counts
    as wanting it), so which target works next never depends on which thread the OS ran first."""

    def __init__(self, n: int) -> None:
        self._cond = threading.Condition()
        self._holder: int | None = None
        self._ready = set(range(n))  # ranks that want the turn (or have not asked yet)
        self._cancelled = False

    def run(self, rank: int, fn: Callable[..., T], *args) -> T:
        """fn(*args) in this thread, holding the turn except while it waits on a child (waiting())."""
        try:
            self._acquire(rank)
            _local.turn = (self, rank)
            return fn(*args)
        finally:
            with self._cond:
                self._ready.discard(rank)
                if self._holder == rank:
                    self._holder = None
                self._cond.notify_all()
            _local.turn = None

    def cancel(self) -> None:
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()

    def _acquire(self, rank: int) -> None:
        with self._cond:
            self._ready.add(rank)
            while not self._cancelled and (self._holder is not None or rank != min(self._ready)):
                self._cond.wait()
            if self._cancelled:
                raise Cancelled("the conversion is stopping")
            self._holder = rank

    def _away(self, rank: int) -> None:
        """`rank` hands the turn on and waits on its child: the next lowest ready rank may go."""
        with self._cond:
            self._ready.discard(rank)
            if self._holder == rank:
                self._holder = None
            self._cond.notify_all()


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """Around a wait on a child process: this thread's turn goes to the next target meanwhile, and
    is taken back (after the holder's turn ends) before the block's caller continues."""
    held = getattr(_local, "turn", None)
    if held is None:
        yield
        return
    turns, rank = held
    _local.turn = None
    turns._away(rank)
    try:
        yield
    finally:
        t = time.perf_counter()
        turns._acquire(rank)
        _local.turn_wait = turn_wait_s() + time.perf_counter() - t
        _local.turn = held


def turn_wait_s() -> float:
    """Seconds this thread has spent waiting for its turn back (another target's work, not its
    own): stage clocks subtract it, so a target's timings stay its own."""
    return getattr(_local, "turn_wait", 0.0)
