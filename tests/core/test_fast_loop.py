"""`make test-fast`'s plugin (tpu_pipeline.testing.fast_loop): what it leaves out, and its guard."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
from pathlib import Path

import pytest

from tpu_pipeline.testing import fast_loop

ROOT = Path(__file__).resolve().parents[2]


def test_the_guard_refuses_every_way_to_start_a_child_and_restores_them():
    before = (subprocess._fork_exec, os.fork, os.system, subprocess._USE_POSIX_SPAWN)
    with fast_loop._no_children(guarded=True):
        with pytest.raises(fast_loop.ChildProcessInFastLoop, match="SLOW_PATHS"):
            subprocess.run(["true"])
        with pytest.raises(fast_loop.ChildProcessInFastLoop):
            multiprocessing.get_context("spawn").Process(target=print).start()
        with pytest.raises(fast_loop.ChildProcessInFastLoop):
            os.fork()
        with pytest.raises(fast_loop.ChildProcessInFastLoop):
            os.system("true")
    # outside a test's setup and call (pytest itself, xdist's workers) nothing is refused
    assert (subprocess._fork_exec, os.fork, os.system, subprocess._USE_POSIX_SPAWN) == before


def test_left_out_paths_match_files_tests_and_parametrized_tests():
    assert fast_loop._left_out("tests/kernels/test_numerics_on_cpu.py::test_rms_norm[shape0]")
    assert fast_loop._left_out("tests/core/test_cli.py::test_console_script_in_subprocess")
    assert fast_loop._left_out("tests/core/test_cli.py::test_version") is None


def test_every_left_out_path_exists_and_says_why():
    for path, why in fast_loop.SLOW_PATHS.items():
        assert (ROOT / path.split("::", 1)[0]).is_file(), path
        assert why.strip(), path


class _Item:
    def __init__(self, nodeid: str, markers: tuple[str, ...] = ()):
        self.nodeid, self.markers = nodeid, markers

    def get_closest_marker(self, name):
        return name if name in self.markers else None


def test_make_test_guards_exactly_what_the_fast_loop_keeps():
    # make test runs with --fast-loop=guard: the tests make test-fast keeps are guarded there too
    assert fast_loop._kept(_Item("tests/core/test_cli.py::test_version"))
    assert not fast_loop._kept(_Item("tests/core/test_cli.py::test_console_script_in_subprocess"))
    assert not fast_loop._kept(_Item("tests/core/test_x.py::test_y", ("slow",)))
    assert not fast_loop._kept(_Item("tests/core/test_x.py::test_y", ("gpu",)))
    before = subprocess._fork_exec
    with fast_loop._no_children(guarded=False):  # a test the fast loop leaves out may start children
        assert subprocess._fork_exec is before
    makefile = (ROOT / "Makefile").read_text()
    full_gate = makefile.split("\ntest: ", 1)[1].split("\n\n", 1)[0]
    assert "-p tpu_pipeline.testing.fast_loop --fast-loop=guard" in full_gate
