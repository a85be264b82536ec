"""The processes a test started: every live descendant of this process, read from /proc (Linux),
so a test can assert that a run left none behind (Chromium's helpers, GPU and TFLM workers)."""

from __future__ import annotations

import os
from pathlib import Path


def _state_and_parent(pid: int) -> tuple[str, int] | None:
    """The process's state letter and parent pid, None once it has ended."""
    try:
        state, ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:2]
    except (OSError, IndexError, ValueError):
        return None
    return state, int(ppid)


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (ended, not yet reaped)."""
    got = _state_and_parent(pid)
    return got is not None and got[0] != "Z"


def descendants(pid: int | None = None) -> set[int]:
    """Pids of the live (not zombie) processes below `pid` (default: this process)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        got = _state_and_parent(int(entry.name))  # None: it ended while we read
        if got is not None and got[0] != "Z":
            parents[int(entry.name)] = got[1]
    found, frontier = set(), {os.getpid() if pid is None else pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found
