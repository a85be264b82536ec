"""The countdown task (tpu_pipeline.train.tasks.countdown): its verifier, splits, the
countdown_lm warm start carried into RL, and the recipe end to end (--steps 3)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from click.testing import CliRunner

from tpu_pipeline.cli import cli
from tpu_pipeline.errors import UserError
from tpu_pipeline.rl.control import supervised_control
from tpu_pipeline.rl.recipe import load_recipe
from tpu_pipeline.rl.rewards import GuardedReward, load_reward
from tpu_pipeline.train.tasks import char_lm, countdown

from .conftest import SMALL, TINY

# Small enough for 2 shared cores: reasoning-gym's generator takes 5-17 ms per problem.
FAST = {**SMALL, "data.options.pool_size": 64, "data.heldout_n": 16, "trainer.eval_k": 2}


def test_reward_is_the_verifier_and_accepts_any_correct_expression():
    info = {"numbers": [6, 4, 4]}
    assert load_reward("countdown") is countdown.compute_score  # grpo_countdown's trainer.reward
    assert countdown.compute_score("countdown", "4*6+4", "28", info) == 1.0  # the generator's solution
    assert countdown.compute_score("countdown", "6*4+4", "28", info) == 1.0  # another one
    assert countdown.compute_score("countdown", "(4+4)*6/2", "28", info) == 0.05  # a number not given
    assert countdown.compute_score("countdown", "6+4+4", "28", info) == 0.05  # misses the target
    assert countdown.compute_score("countdown", "#### 28", "28", info) == 0.01  # not an expression
    guard = GuardedReward(countdown.compute_score)
    rep = guard([("countdown", "6*4+4", "28", {}), ("countdown", "6*4+4", "28", info)])
    guard.close()
    assert rep.scores == [0.0, 1.0] and rep.errors == 1 and "extra_info['numbers'] is missing" in rep.first_error


def test_prompt_format_and_supervision_on_the_solution_only():
    p = countdown.Problem((2, 7, 4), 1, "7-4-2")
    assert p.prompt == "2 7 4#1="
    tok = char_lm.build_tokenizer()
    ids, labels = countdown.lm_batch(tok, [p])
    n_prompt = len(tok(p.prompt)["input_ids"])  # BOS + 8 characters
    assert n_prompt == 9 and ids.shape == (1, 9 + 5 + 1)
    taught = labels[0][labels[0] != char_lm.IGNORE].tolist()
    assert tok.decode(taught[:-1]) == "7-4-2" and taught[-1] == tok.eos_token_id


def test_problems_come_from_reasoning_gym_and_are_cached(tmp_path):
    ps = countdown.make_problems(40, seed=3)
    assert len(ps) == 40 and all(len(p.numbers) == 3 and 1 <= p.target <= 30 for p in ps)
    assert all(countdown.score(p.solution, p.numbers, p.target) == 1.0 for p in ps)
    countdown._generate.cache_clear()
    assert countdown.make_problems(40, seed=3) == ps  # read back from $TPU_PIPELINE_HOME/data
    with pytest.raises(UserError, match="countdown difficulty: unknown key 'max_digits'"):
        countdown.Difficulty.from_dict({"max_digits": 2})
    with pytest.raises(UserError, match="need 1 <= min_value <= max_value"):
        countdown.Difficulty(min_value=5, max_value=2)


def test_source_keeps_held_out_prompts_out_of_training():
    src = countdown.CountdownSource(countdown.Difficulty(), heldout_n=16, seed=0, pool_n=64)
    held = {p.prompt for p in src.heldout()}
    assert len(held) == 16
    pool0 = {p.prompt for p in countdown.make_problems(64, 0)}
    assert not held & pool0  # neither the warm start (seed-0 pool) nor RL saw a held-out prompt
    b = src.train_batch(2, 32, 0)
    assert not {p.prompt for p in b} & held and b == src.train_batch(2, 32, 0) != src.train_batch(3, 32, 0)
    assert b[0].extra_info["numbers"] and b[0].ground_truth == str(b[0].extra_info["target"])
    other = countdown.CountdownSource(countdown.Difficulty(), heldout_n=16, seed=5, pool_n=64)
    assert other.heldout() == src.heldout()  # the held-out split does not move with the seed


def test_grpo_countdown_three_steps_and_eval_with_a_seed(tmp_path, tiny_policy, monkeypatch):
    out = tmp_path / "run"
    args = ["rl", "--recipe", "grpo_countdown", "--out", str(out), "--policy", str(tiny_policy), "--steps", "3"]
    for k, v in FAST.items():
        args += ["--set", f"{k}={v}"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    ev = json.loads((out / "eval.json").read_text())
    assert ev["steps"] == 3 and ev["before"]["n"] == 16 and ev["before"]["k"] == 2
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    # a random policy earns the verifier's 0.01 (no expression) or 0.05 (wrong one) per sample
    assert all(0.01 <= r["reward"] < 0.5 for r in rows)
    # eval has no --set: its source gets the small pool the run used (fresh problems exclude it)
    monkeypatch.setattr(countdown.CountdownSource, "from_config", classmethod(lambda cls, d, seed: cls(
        countdown.Difficulty.from_dict(d.difficulty), d.heldout_n, seed, FAST["data.options.pool_size"])))
    res = CliRunner().invoke(cli, ["eval", "--recipe", "grpo_countdown", "--policy", str(out / "policy"),
                                   "--seed", "7", "--n", "12", "--k", "0", "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output[res.output.index("{"):])
    assert got["split"] == "fresh(seed=7)" and got["n"] == 12 and 0.0 <= got["accuracy"] <= 1.0
    src = countdown.CountdownSource(countdown.Difficulty(), 16, 0, FAST["data.options.pool_size"])
    fresh = {p.prompt for p in src.fresh(12, 7)}
    assert len(fresh) == 12 and not fresh & {p.prompt for p in countdown.make_problems(64, 0)}


def test_warm_start_is_countdown_lm_and_its_adam_state_is_carried(tmp_path):
    from tpu_pipeline.rl import run

    ws = {"loop.steps": 3, "loop.log_every": 1, "countdown.n_heldout": 8, "countdown.pass_k": 0,
          **{f"countdown.{k}": v for k, v in TINY.items()}}
    res = run("grpo_countdown", tmp_path / "run", steps=1, progress=False, log=lambda m: None,
              overrides={**FAST, "policy.warm_start_overrides": ws, "trainer.eval_k": 0})
    info = res["warm_start"]
    assert info["recipe"] == "countdown_lm" and info["optimizer_state_carried"] is True and info["cached"] is False
    assert info["overrides"]["countdown.n_train"] == 64  # the warm start trains on RL's seed-0 pool
    assert res["steps"] == 1


@pytest.mark.parametrize("override,match", [
    ({"data.difficulty": {"max_value": 0}}, "data.difficulty: countdown difficulty: need 1 <= min_value <= max_value"),
    ({"data.difficulty": {"terms": 3}}, "countdown difficulty: unknown key 'terms'"),
    ({"data.options": {"tasks": ["chain_sum"]}}, "data.options: unknown key 'tasks'; valid keys: pool_size"),
    ({"data.options.pool_size": 0}, "data.options.pool_size must be >= 1"),
])
def test_bad_countdown_input_is_one_line_user_error(tmp_path, tiny_policy, override, match):
    from tpu_pipeline.rl import run

    with pytest.raises(UserError, match=match):
        run("grpo_countdown", tmp_path / "r", policy=str(tiny_policy), steps=1, progress=False, log=lambda m: None,
            overrides={**FAST, **override})


def test_supervised_control_learns_the_pool_solutions_and_reports(tmp_path, tiny_policy):
    shutil.copytree(tiny_policy, tmp_path / "ws" / "hf")
    torch.manual_seed(0)
    cfg = load_recipe("grpo_countdown", {k: v for k, v in FAST.items() if k.startswith("data.")})
    res = supervised_control(cfg, tmp_path / "ws", seconds=3.0, lr=3e-3, batch_size=16)
    assert res["steps"] >= 1 and res["optimizer_state_carried"] is False
    assert res["n"] == 16  # the RL run's held-out split (data.heldout_n)
    assert res["lr"] == 3e-3 and 0.0 <= res["accuracy"] <= 1.0
