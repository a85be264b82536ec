"""Bad input: one clear line, exit 2, and runs that survive a bad reward."""

from __future__ import annotations

import json
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tpu_pipeline.cli import cli
from tpu_pipeline.errors import DivergedError, UserError
from tpu_pipeline.train.tasks.rows import Problem, read_parquet, write_parquet
from tpu_pipeline.rl.rewards import GuardedReward

from .conftest import SMALL

GOOD = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "1+2="}], "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "3"}, "extra_info": {"index": 0}}


def _write(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_verl_parquet_round_trip(tmp_path):
    probs = [Problem("1+2=", "3", "chain_sum"), Problem([{"role": "user", "content": "q"}], "7", "openai/gsm8k")]
    path = write_parquet(probs, tmp_path / "d.parquet", "train")
    back = read_parquet(path)
    assert [p.ground_truth for p in back] == ["3", "7"]
    assert back[0].prompt == [{"role": "user", "content": "1+2="}] and back[1].data_source == "openai/gsm8k"
    row = pq.read_table(path).to_pylist()[0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}


@pytest.mark.parametrize("bad,match", [
    ({"reward_model": {"style": "rule"}}, "row 2: 'reward_model.ground_truth' is missing"),
    ({"prompt": [{"content": "x"}]}, r"row 2: prompt\[0\] must be"),
    ({"data_source": ""}, "row 2: 'data_source'"),
])
def test_malformed_rows_name_their_row(tmp_path, bad, match):
    rows = [GOOD, GOOD, {**GOOD, **bad}]
    with pytest.raises(UserError, match=match):
        read_parquet(_write(tmp_path / "d.parquet", rows))


def test_not_a_parquet_file_is_exit_2(tmp_path, tiny_policy):
    f = tmp_path / "x.parquet"
    f.write_text("hello")
    r = CliRunner().invoke(cli, ["rl", "--data", str(f), "--policy", str(tiny_policy), "--steps", "1",
                                 "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "not a readable parquet file" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o").exists()


def test_reward_that_raises_or_hangs_is_bounded_and_counted(test_rewards):
    items = [("x", "#### 1", "1", None), ("x", "1", "1", None), ("x", "#", "1", None), ("x", "2", "1", None)]
    rep = GuardedReward(test_rewards.raises_sometimes, 1.0)(items)
    assert rep.scores == [0.0, 1.0, 0.0, 1.0] and rep.errors == 2 and "exploded" in rep.first_error
    t0 = time.time()
    rep = GuardedReward(test_rewards.hangs_on_hash, 0.3)(items)
    assert time.time() - t0 < 15  # the 0.3 s timeouts ended the calls, not the 30 s hangs (slack for a loaded box)
    assert rep.scores == [0.0, 1.0, 0.0, 1.0] and rep.timeouts == 2
    rep = GuardedReward(test_rewards.returns_nan, 1.0)(items[:2])
    assert rep.scores == [0.0, 0.0] and rep.errors == 2


def test_run_continues_through_a_hanging_reward(tmp_path, tiny_policy, test_rewards):
    from tpu_pipeline.rl import run

    ov = {**SMALL, "trainer.reward_timeout_s": 0.2, "trainer.eval_k": 0, "data.heldout_n": 4,
          "trainer.prompts_per_step": 2, "rollout.n": 2}
    res = run("grpo_math", tmp_path / "r", policy=str(tiny_policy), steps=2, reward="rewards_for_tests:hangs_on_hash",
              overrides=ov, progress=False, log=lambda m: None)
    assert res["steps"] == 2
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["reward_timeouts"] for r in rows) == res["totals"]["reward_timeouts"]


def test_nan_loss_steps_are_skipped_then_the_run_stops(tmp_path, tiny_policy, test_rewards, monkeypatch):
    import torch

    from tpu_pipeline.rl import algo, run

    real = algo.policy_loss

    def nan_loss(**kw):
        loss, m = real(**kw)
        return loss * torch.tensor(float("nan")), m

    monkeypatch.setattr(algo, "policy_loss", nan_loss)
    ov = {**SMALL, "trainer.max_nan_steps": 2, "trainer.eval_k": 0, "optim.lr": 1e-3}
    with pytest.raises(DivergedError) as e:
        run("grpo_math", tmp_path / "r", policy=str(tiny_policy), steps=5, reward="rewards_for_tests:starts_with_hash",
            overrides=ov, progress=False, log=lambda m: None)
    assert e.value.exit_code == 5 and not isinstance(e.value, UserError)  # the run diverged; the input was fine
    assert str(e.value) == ("diverged: the loss was NaN/inf in 2 consecutive steps, the last at step 2 "
                            "(trainer.max_nan_steps=2); no checkpoint was written before it; try a lower "
                            "learning rate (--set optim.lr=...) or another --seed")
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("skipped") for r in rows] == ["non-finite loss"]  # the 2nd raised before logging
    assert not (tmp_path / "r" / "policy").exists()


def test_overlong_prompts_refused_or_truncated(tiny_policy):
    from tpu_pipeline.rl.evaluate import encode_prompts
    from tpu_pipeline.rl.policy import load_policy

    _, tok = load_policy(tiny_policy)
    probs = [Problem("1+2+3+4+5+6+7+8=", "36", "chain_sum")]
    with pytest.raises(UserError, match="over data.max_prompt_length=8"):
        encode_prompts(tok, probs, 8, "refuse")
    ids = encode_prompts(tok, probs, 8, "truncate")[0]
    assert len(ids) == 8 and ids[0] == tok.bos_token_id and tok.decode(ids[1:]) == "+6+7+8="


def test_unknown_recipe_key_and_bad_values_are_exit_2(tmp_path):
    r = CliRunner().invoke(cli, ["rl", "--set", "optim.lrr=1", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "unknown key 'lrr'" in r.output
    r = CliRunner().invoke(cli, ["rl", "--set", "rollout.n=1", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "rollout.n must be >= 2" in r.output
    r = CliRunner().invoke(cli, ["rl", "--reward", "nosuchmodule:f", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "cannot import" in r.output
    r = CliRunner().invoke(cli, ["rl", "--reward", "countdwn", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "not a registered reward (countdown, verl_default)" in r.output
    r = CliRunner().invoke(cli, ["rl", "--set", "data.source=arithm", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "unknown rl task source 'arithm'; valid: arith, countdown" in r.output
    r = CliRunner().invoke(cli, ["rl", "--set", "data.options.taks=[]", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "data.options: unknown key 'taks'; valid keys: tasks" in r.output


def test_a_recipe_copied_before_the_tasks_layer_is_told_what_moved(tmp_path):
    from tpu_pipeline.recipes import find_recipe

    text = find_recipe("rl", "grpo_math").read_text()
    old = tmp_path / "old.toml"
    # the [data] of a copy made before data.source existed: the task list sat in [data] itself
    old.write_text(text.replace('source = "arith"', 'tasks = ["basic_arithmetic", "chain_sum"]', 1))
    r = CliRunner().invoke(cli, ["rl", "--recipe", str(old), "--steps", "1", "--out", str(tmp_path / "run")])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "data: unknown key 'tasks'" in r.output and "data.source = one of arith, countdown" in r.output
    assert not (tmp_path / "run").exists()
