"""Shared fixtures. Hardware needs are markers: `tpu` and `gpu` tests run
only where that hardware is present; everything else runs on CPU."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")


def pytest_collection_modifyitems(config, items):
    import torch

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
