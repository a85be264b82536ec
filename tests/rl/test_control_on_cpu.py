"""The supervised control (bench/rl.py control): the task source's batches and the
char-LM loss (grpo_math: the RL prompt stream), the warm start's optimizer carried,
a NaN loss a DivergedError."""

from __future__ import annotations

import shutil

import pytest
import torch

from tpu_pipeline.errors import DivergedError
from tpu_pipeline.rl.recipe import load_recipe
from tpu_pipeline.rl.control import supervised_control
from tpu_pipeline.train.tasks import char_lm

from .conftest import SMALL


@pytest.fixture
def warm_dir(tmp_path, tiny_policy):
    shutil.copytree(tiny_policy, tmp_path / "ws" / "hf")
    return tmp_path / "ws"


def test_control_trains_on_true_answers_and_reports(warm_dir):
    torch.manual_seed(0)
    cfg = load_recipe("grpo_math", {k: v for k, v in SMALL.items() if k.startswith("data.")})
    res = supervised_control(cfg, warm_dir, seconds=1.0, lr=1e-3, batch_size=8)
    assert res["steps"] >= 1 and res["n"] == 40 and 0.0 <= res["accuracy"] <= 1.0
    assert res["optimizer_state_carried"] is False and res["lr"] == 1e-3 and res["batch_size"] == 8


def test_control_nan_loss_is_diverged(warm_dir, monkeypatch):
    cfg = load_recipe("grpo_math", {k: v for k, v in SMALL.items() if k.startswith("data.")})
    monkeypatch.setattr(char_lm, "lm_loss_sum", lambda model, ids, labels: torch.tensor(float("nan")))
    with pytest.raises(DivergedError, match="supervised control's loss became NaN/inf at step 1"):
        supervised_control(cfg, warm_dir, seconds=5.0, batch_size=8)
