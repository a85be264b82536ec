"""Latency measurement shared by the model kinds: one thread on both sides and
a time budget per measurement, so figures are comparable and stable."""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

import numpy as np
import torch

MEASURE_THREADS = 1  # torch eager and LiteRT both on one thread: comparable and stable when cores are shared
LATENCY_BUDGET_S = 0.25  # per measurement: at least 5, at most 50 runs


@contextlib.contextmanager
def torch_threads(n: int = MEASURE_THREADS) -> Iterator[None]:
    """torch's intra-op threads for a measurement. One thread: OpenMP workers spin-wait,
    and on a shared 2-core machine two threads made eager timings 100x noisier."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def median_ms(fn: Callable[[], object], *, budget_s: float = LATENCY_BUDGET_S, min_runs: int = 5,
              max_runs: int = 50) -> float:
    """Median wall milliseconds of `fn()` after one warm-up call."""
    fn()
    times: list[float] = []
    while len(times) < min_runs or (sum(times) < budget_s and len(times) < max_runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)
