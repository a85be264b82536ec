"""busy_cores measures what other processes run now, not the past minute's load average: a busy
child shows up, and an idle machine reads idle even while the load average still counts a run
that just ended (why a second rl run got one thread)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tpu_pipeline import cpu_load


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads Linux /proc/stat")
def test_a_spinning_child_is_one_busy_core():
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = cpu_load.busy_cores(0.5)
    finally:
        spin.kill()
        spin.wait()
    # the child alone keeps a core busy, whatever else runs beside it (a 1-minute load average of a
    # quiet machine would read ~0 this soon after it started)
    assert busy >= 0.8, busy


def test_the_decision_follows_the_measurement_not_the_load_average(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr("os.getloadavg", lambda: (9.0, 9.0, 9.0))  # a run that just ended
    monkeypatch.setattr(cpu_load, "_cpu_ticks", iter([(1000, 900, 2), (1100, 990, 2)]).__next__)
    assert cpu_load.busy_cores(0.0) == pytest.approx(0.2)  # 10 of 100 ticks busy on 2 CPUs
    monkeypatch.setattr(cpu_load, "busy_cores", lambda: 0.2)
    assert not cpu_load.others_load_the_cores()
    monkeypatch.setattr(cpu_load, "busy_cores", lambda: 1.7)
    assert cpu_load.others_load_the_cores()


def test_without_proc_stat_the_load_average_decides(monkeypatch):
    def unreadable():
        raise OSError("no /proc")

    monkeypatch.setattr(cpu_load, "_cpu_ticks", unreadable)
    monkeypatch.setattr("os.getloadavg", lambda: (1.5, 1.0, 1.0))
    assert cpu_load.busy_cores(0.0) == 1.5
