"""The processes a test started: every live descendant of this process, read from /proc (Linux),
so a test can assert that a run left none behind (Chromium's helpers, GPU and TFLM workers)."""

from __future__ import annotations

import os
from pathlib import Path


def descendants(pid: int | None = None) -> set[int]:
    """Pids of the live (not zombie) processes below `pid` (default: this process)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, IndexError, ValueError):
            continue  # it ended while we read
        if state != "Z":
            parents[int(entry.name)] = int(ppid)
    found, frontier = set(), {os.getpid() if pid is None else pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found
