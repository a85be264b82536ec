"""Shared fixtures. Hardware needs are markers: `tpu` and `gpu` tests run
only where that hardware is present; everything else runs on CPU."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")


# The files that run longest (from the slowest tests of a fresh-clone `make test`, 2026-12-01; its
# summary prints the seconds per file), longest first:
# collected first and in this order, so that `make test`'s two workers (pytest-xdist, whole files per
# worker; --no-loadscope-reorder keeps this order, xdist would otherwise sort files by how many tests
# they hold) start them early, one each, and finish on short files instead of one running a long file
# alone at the end.
LONG_FILES = (
    "tests/rl/test_verl_launch_on_cpu.py",  # three real VeRL launches and a warm start
    "tests/rl/test_ray_cluster_on_cpu.py",  # a two-node Ray cluster, a VeRL job across it, bad input against it
    "tests/rl/test_verl_weight_sync_on_cpu.py",  # vLLM's engine seven times, one per CPU GEMM path
    "tests/convert/test_lm_families_on_cpu.py",  # seven .litertlm exports in one child process
    "tests/convert/test_lm_export.py",
    "tests/convert/test_litertlm_on_cpu.py",
    "tests/convert/test_kinds_on_cpu.py",
    "tests/convert/test_shape_buckets_on_cpu.py",  # each bucket through every target's steps, four runtimes
    "tests/convert/test_npu_target_on_cpu.py",  # LiteRT's AOT compile per SoC and the HTP simulator
    "tests/convert/test_convert_under_load_on_cpu.py",  # conversions and browser sessions beside busy processes
    "tests/core/test_tpu_contract_on_cpu.py",  # the real torch-tpu, in .venv-tpu's children
    "tests/rl/test_resume_on_cpu.py",
    "tests/convert/test_app_io_on_cpu.py",  # five conversions, each target through MediaPipe Tasks' children
    "tests/convert/test_hf_tasks_on_cpu.py",  # five HF folders trained and converted, one on android with MediaPipe
    "tests/train/test_resume_on_cpu.py",
)


def _long_first(item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return LONG_FILES.index(path) if path in LONG_FILES else len(LONG_FILES)


def pytest_collection_modifyitems(config, items):
    import torch

    items.sort(key=_long_first)  # stable: the rest keep their order

    has_cuda = torch.cuda.is_available()
    # torch-tpu 0.2.0 raises on the legacy torch.tpu device queries; the library's probe asks
    # torch.accelerator in a child process, and only where a TPU host's signs are.
    from tpu_pipeline._tpu_guard import probe_tpu, torch_tpu_version, tpu_hardware_present

    has_tpu = tpu_hardware_present() and torch_tpu_version() is not None and probe_tpu().count > 0
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "tpu" in item.keywords and not has_tpu:
            item.add_marker(pytest.mark.skip(reason="needs a TPU"))


# Seconds of setup + call + teardown per xdist worker and per file, reported by the controller at the
# end of `make test`: the balance of the workers (and which files to list in LONG_FILES) is read from it.
_BUSY: dict[str, dict[str, float]] = {}


def pytest_runtest_logreport(report):
    node = getattr(report, "node", None)  # set by xdist on the controller; absent in a plain run
    worker = node.gateway.id if node is not None else "main"
    files = _BUSY.setdefault(worker, {})
    path = report.nodeid.split("::", 1)[0]
    files[path] = files.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    if not _BUSY or hasattr(terminalreporter.config, "workerinput"):
        return
    terminalreporter.section("seconds per worker (setup + call + teardown)")
    for worker, files in sorted(_BUSY.items()):
        first = ", ".join(list(files)[:3])  # in the order the worker ran them
        terminalreporter.write_line(f"{worker}: {sum(files.values()):.0f} s in {len(files)} files (first: {first})")
    slowest = sorted(((s, f) for files in _BUSY.values() for f, s in files.items()), reverse=True)[:15]
    terminalreporter.write_line("slowest files: " + ", ".join(f"{f} {s:.0f}" for s, f in slowest))


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    """Keeps caches and run folders of every test out of the user's home."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("TPU_PIPELINE_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")


@pytest.fixture
def private_tmp(tmp_path_factory, monkeypatch):
    """A temporary folder of the test's own, as TMPDIR for it and its children: what a run leaves
    behind in the temporary folder (nothing, when it cleans up) is what this folder holds after it."""
    import getpass
    import tempfile

    tmp = tmp_path_factory.mktemp("tmpdir")
    # inductor's compile cache is meant to outlive a run: it stays where it was (its default, under
    # the real temporary folder), for this process and its children
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.environ.get(
        "TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")))
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # gettempdir() caches its first answer
    return tmp
