"""Whether other work already keeps this machine's cores busy: both rl engines pick their CPU
thread count by it (every core on an idle machine, one thread beside other work: competing
OpenMP threads spin-wait for each other, 5-10x slower on the shared 2-core box)."""

from __future__ import annotations

import os
import time
from pathlib import Path

WINDOW_S = 0.3


def busy_cores(window_s: float = WINDOW_S) -> float:
    """Cores other processes keep busy, measured over the next `window_s` seconds (Linux
    /proc/stat; the caller sleeps meanwhile). Not the 1-minute load average: it counts a run that
    has just ended for a minute more, so a second run right after a first got one thread (the
    engines' side-by-side bench, docs/BENCHMARKS.md). Falls back to the load average where
    /proc/stat cannot be read, and to 0.0 where neither exists."""
    try:
        before = _cpu_ticks()
        time.sleep(window_s)
        after = _cpu_ticks()
    except (OSError, ValueError, IndexError):
        return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    total, idle = after[0] - before[0], after[1] - before[1]
    return after[2] * (total - idle) / total if total > 0 else 0.0


def _cpu_ticks() -> tuple[int, int, int]:
    """(all ticks, idle + iowait ticks, CPUs counted) from /proc/stat's summary line."""
    lines = Path("/proc/stat").read_text().splitlines()
    f = [int(x) for x in lines[0].split()[1:9]]  # user nice system idle iowait irq softirq steal
    cpus = sum(1 for ln in lines[1:] if ln.startswith("cpu"))
    return sum(f), f[3] + f[4], cpus


def others_load_the_cores() -> bool:
    """True when other work keeps about every core but one busy (or the only one)."""
    cores = os.cpu_count() or 1
    return busy_cores() > max(cores - 1, 0.5)
