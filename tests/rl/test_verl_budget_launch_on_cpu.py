"""`rl --engine verl` from nothing, taking the recipe as it is: no warm start in the cache (the
test's own TPU_PIPELINE_HOME), so it is trained first, as the local engine would; then VeRL's
trainer runs under the recipe's time budget (no --steps) and is stopped after the step that
spends it, at that step's checkpoint. A budget of 0.01 s is spent by the first step on any
machine, so the run stops after step 1 however fast or loaded the box is."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner
from omegaconf import OmegaConf

from tpu_pipeline.cli import cli

from .conftest import SMALL
from .test_verl_launch_on_cpu import TEST_TAG, TESTS_PATH, _left_in_tmp, _marked_processes, _need_the_extra

# A warm start of seconds (the recipe's model, 20 updates, a small held-out check): a real one,
# trained and cached by the launch itself.
WARM_START = json.dumps({"loop.steps": 20, "loop.batch_size": 16, "loop.log_every": 10, "arith.n_heldout": 40,
                         "arith.pass_k": 0})


@pytest.mark.slow
def test_verl_from_an_empty_cache_trains_the_warm_start_and_honours_the_time_budget(tmp_path, monkeypatch):
    _need_the_extra()
    home = Path(os.environ["TPU_PIPELINE_HOME"])
    assert not (home / "warm_start").exists()
    out, tag, in_tmp = tmp_path / "run", uuid.uuid4().hex, _left_in_tmp()
    monkeypatch.setenv(TEST_TAG, tag)
    monkeypatch.setenv("PYTHONPATH", TESTS_PATH)
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    small = {k: v for k, v in SMALL.items() if k != "trainer.time_budget_s"}
    r = CliRunner().invoke(cli, ["rl", "--recipe", "grpo_math", "--engine", "verl", "--time-budget", "0.01",
                                 "--reward", "rewards_for_tests:odd_char_sum", "--out", str(out),
                                 "--set", f"policy.warm_start_overrides={WARM_START}"]
                           + [x for k, v in small.items() for x in ("--set", f"{k}={v}")])
    log = (out / "verl" / "trainer.log").read_text()[-4000:] if (out / "verl" / "trainer.log").is_file() else ""
    assert r.exit_code == 0, r.output + log
    cached = list((home / "warm_start").glob("arith_lm-*/hf/config.json"))
    assert len(cached) == 1 and "warm start: training arith_lm" in r.output
    assert OmegaConf.load(out / "verl" / "ppo_trainer.yaml").actor_rollout_ref.model.path == str(cached[0].parent)
    assert "time budget 0.01 s spent after step 1" in r.output
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1]
    assert rows[0]["rollout_probs_diff_max"] < 1e-3
    evals = json.loads((out / "eval.json").read_text())
    assert evals["steps"] == 1 and evals["stopped"].startswith("time budget 0.01 s spent after step 1")
    assert evals["checkpoint"].endswith("global_step_1") and evals["leftover_processes"] == []
    assert any((out / "policy").glob("*.safetensors")) and (out / "policy" / "config.json").is_file()
    assert _marked_processes(tag) == [] and _left_in_tmp() - in_tmp == set()
