"""Shared fixtures. Hardware needs are markers: `tpu` and `gpu` tests run
only where that hardware is present; everything else runs on CPU."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")


# Files that run for minutes (real VeRL launches): collected first, so that with `make test`'s two
# workers (pytest-xdist, whole files per worker) one worker runs them while the other runs the rest,
# instead of them starting last and running alone.
LONG_FILES = ("tests/rl/test_verl_launch_on_cpu.py",)


def pytest_collection_modifyitems(config, items):
    import torch

    items.sort(key=lambda item: not item.nodeid.startswith(LONG_FILES))  # stable: the rest keep their order

    has_cuda = torch.cuda.is_available()
    has_tpu = hasattr(torch, "tpu") and torch.tpu.is_available()
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "tpu" in item.keywords and not has_tpu:
            item.add_marker(pytest.mark.skip(reason="needs a TPU"))


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    """Keeps caches and run folders of every test out of the user's home."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("TPU_PIPELINE_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
