"""A run whose loss turns NaN stops with DivergedError (exit 5), not a bad-input
error, and keeps its last good checkpoint, from which it resumes."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from tpu_pipeline.cli import cli
from tpu_pipeline.errors import DivergedError, UserError
from tpu_pipeline.train import run
from tpu_pipeline.train.tasks.digits import DigitsTask

CFG = {"loop.steps": 20, "loop.log_every": 5, "loop.checkpoint_every": 5, "loop.eval_every": 0,
       "loop.batch_size": 32}


@pytest.fixture
def nan_from_step_8(monkeypatch):
    """The loss of every step from the 8th on is NaN (one loss_sum call per step in one process)."""
    real = DigitsTask.loss_sum
    calls = []

    def loss_sum(self, model, batch):
        calls.append(1)
        loss = real(self, model, batch)
        return loss * float("nan") if len(calls) >= 8 else loss

    monkeypatch.setattr(DigitsTask, "loss_sum", loss_sum)
    return monkeypatch


def test_nan_loss_is_a_diverged_error_and_the_last_good_checkpoint_resumes(tmp_path, nan_from_step_8):
    torch.set_num_threads(1)
    out = tmp_path / "d"
    with pytest.raises(DivergedError) as e:
        run("digits_cnn", out, overrides=CFG)
    assert e.value.exit_code == 5 and not isinstance(e.value, UserError)
    assert str(e.value) == (
        f"diverged: digits_cnn's loss or gradient norm became NaN/inf at step 8; the last good checkpoint "
        f"(step 5) is kept in {out / 'checkpoints'}; try a lower learning rate (--set optim.lr=...) or another --seed")
    assert json.loads((out / "checkpoints/latest.json").read_text())["step"] == 5
    assert sorted(p.name for p in (out / "checkpoints").glob("step_*")) == ["step_000005.pt"]
    assert not (out / "model.pt").exists() and not (out / "eval.json").exists()
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [5]  # the step-10 row (NaN) was never written

    nan_from_step_8.undo()
    ev = run("digits_cnn", out, overrides=CFG, resume=True)
    clean = run("digits_cnn", tmp_path / "clean", overrides=CFG)
    assert ev["resumed_from"] == 5 and ev["accuracy"] == clean["accuracy"]
    rows = [(r["step"], r["loss"]) for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]
    want = [(r["step"], r["loss"]) for r in map(json.loads, (tmp_path / "clean/metrics.jsonl").read_text().splitlines())]
    assert [s for s, _ in rows] == [5, 10, 15, 20] and rows == want  # the kept checkpoint was a good one


def test_cli_diverged_run_is_one_line_exit_5(tmp_path, nan_from_step_8):
    torch.set_num_threads(1)
    args = ["train", "--recipe", "digits_cnn", "--out", str(tmp_path / "c")]
    for k, v in CFG.items():
        args += ["--set", f"{k}={v}"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 5, r.output
    lines = [x for x in r.stderr.strip().splitlines() if not x.startswith("step ")]  # progress lines aside
    assert len(lines) == 1 and lines[0].startswith("Error: diverged: digits_cnn's loss or gradient norm became "
                                                   "NaN/inf at step 8; the last good checkpoint (step 5)")
