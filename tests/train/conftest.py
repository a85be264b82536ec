"""Train tests share 2 cores with everything else: one intra-op thread keeps
them from oversubscribing (2 threads under load were 6x slower here)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
