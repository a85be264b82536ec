"""--nproc 2 (torchrun + DistributedDataParallel, gloo) matches one process.

Tolerance: every logged loss within 1e-4 relative and every final weight
within 1e-4 absolute. Each process computes its shard's summed loss over
the global count, so the mathematics is the same; only float summation
order differs (gradient all-reduce, per-shard reductions).
"""

from __future__ import annotations

import json

import pytest
import torch

from tpu_pipeline.train import run

CFG = {"loop.steps": 20, "loop.log_every": 5, "loop.checkpoint_every": 0, "loop.eval_every": 0,
       "loop.batch_size": 64, "digits.dropout": 0.0}  # dropout masks would differ per shard


def _losses(out):
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_processes_match_one(tmp_path, private_tmp):
    torch.set_num_threads(1)
    one = run("digits_cnn", tmp_path / "one", overrides=CFG, seed=1)
    two = run("digits_cnn", tmp_path / "two", overrides=CFG, seed=1, nproc=2)
    assert list(private_tmp.iterdir()) == []  # torchrun's log folder went with the launch's
    assert two["processes"] == 2 and one["processes"] == 1
    a, b = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert len(a) == len(b) == 4
    assert b == pytest.approx(a, rel=1e-4)
    wa = torch.load(tmp_path / "one/model.pt", weights_only=True)["state_dict"]
    wb = torch.load(tmp_path / "two/model.pt", weights_only=True)["state_dict"]
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], atol=1e-4, rtol=0)
    assert abs(one["accuracy"] - two["accuracy"]) <= 1 / one["n"] + 1e-9


def test_batch_must_split_evenly(tmp_path):
    from tpu_pipeline.errors import UserError

    with pytest.raises(UserError, match="divisible by the number of processes"):
        run("digits_cnn", tmp_path / "x", overrides={**CFG, "loop.batch_size": 33}, nproc=2)


@pytest.mark.slow
def test_a_diverged_worker_is_a_diverged_error_in_the_launcher(tmp_path):
    # torchrun exits 1 whatever its workers return: the worker's own error must still reach the user (exit 5)
    from tpu_pipeline.errors import DivergedError

    with pytest.raises(DivergedError, match=r"^diverged: digits_cnn's loss .* \(process [01]\)$") as e:
        run("digits_cnn", tmp_path / "x", overrides={**CFG, "optim.lr": 1e12}, nproc=2)
    assert e.value.exit_code == 5
