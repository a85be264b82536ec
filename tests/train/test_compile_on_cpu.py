"""--compile (Inductor) trains like eager; --pallas either trains or says clearly why not."""

from __future__ import annotations

import json

import pytest
import torch

from tpu_pipeline.errors import NotBuiltError
from tpu_pipeline.train import run

CFG = {"loop.steps": 8, "loop.log_every": 4, "loop.batch_size": 32, "digits.dropout": 0.0}


def _losses(out):
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_compiled_losses_match_eager(tmp_path):
    torch.set_num_threads(1)
    run("digits_cnn", tmp_path / "eager", overrides=CFG, compile=False)
    ev = run("digits_cnn", tmp_path / "compiled", overrides=CFG, compile=True)
    assert ev["compile"] is True
    assert _losses(tmp_path / "compiled") == pytest.approx(_losses(tmp_path / "eager"), rel=1e-4)


@pytest.mark.slow
def test_pallas_trains_or_fails_with_one_clear_error(tmp_path):
    torch.set_num_threads(1)
    try:
        ev = run("digits_cnn", tmp_path / "p", overrides={**CFG, "loop.steps": 2}, pallas=True)
    except NotBuiltError as e:  # torch 2.13's Inductor Pallas generator fails on this CNN
        assert "--pallas: Inductor's Pallas code generator failed" in str(e)
        assert not (tmp_path / "p" / "model.pt").exists()
    else:
        assert ev["pallas"] is True and (tmp_path / "p" / "model.pt").exists()
