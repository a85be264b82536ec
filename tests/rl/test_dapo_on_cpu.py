"""dapo_math: each DAPO piece against VeRL's own code or values worked out by hand,
the dynamic-sampling rounds of the engine, and the recipe end to end (--steps 3)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from tpu_pipeline.cli import cli
from tpu_pipeline.errors import UserError
from tpu_pipeline.rl import algo, dapo
from tpu_pipeline.rl.recipe import AlgorithmConfig, load_recipe
from tpu_pipeline.train.tasks.rows import Problem
from tpu_pipeline.rl.engine import Engine
from tpu_pipeline.rl.rollout import Rollout

from .conftest import SMALL


def test_recipe_holds_verls_dapo_settings():
    cfg = load_recipe("dapo_math")
    a = cfg.algorithm
    assert (a.clip_ratio_low, a.clip_ratio_high, a.loss_agg_mode, a.use_kl_loss) == (0.2, 0.28, "token-mean", False)
    assert a.filter_groups.enable and a.filter_groups.max_num_gen_batches == 3
    assert a.overlong_buffer.enable and (a.overlong_buffer.len, a.overlong_buffer.penalty_factor) == (4, 1.0)
    assert cfg.trainer.minibatches == 2  # the decoupled clip only acts from the second update of a step on
    g = load_recipe("grpo_math")
    same = lambda c: (c.policy.warm_start, c.data.source, c.data.options, c.data.difficulty, c.optim.lr)  # noqa: E731
    assert same(cfg) == same(g)


def test_overlong_penalty_is_verls_dapo_reward_manager():
    from verl import DataProto
    from verl.workers.reward_manager.dapo import DAPORewardManager

    from tpu_pipeline.train.tasks import char_lm

    tok = char_lm.build_tokenizer()
    R, lengths = 16, [3, 12, 13, 14, 16]
    B = len(lengths)
    resp_mask = torch.tensor([[1] * L + [0] * (R - L) for L in lengths])
    batch = DataProto.from_dict(
        tensors={"prompts": torch.ones(B, 4, dtype=torch.long), "responses": torch.full((B, R), 5),
                 "attention_mask": torch.cat([torch.ones(B, 4, dtype=torch.long), resp_mask], 1)},
        non_tensors={"reward_model": np.array([{"ground_truth": "1"}] * B, dtype=object),
                     "data_source": np.array(["x"] * B, dtype=object),
                     "extra_info": np.array([{} for _ in range(B)], dtype=object)})
    mgr = DAPORewardManager(tok, 0, compute_score=lambda **kw: 1.0, max_resp_len=R,
                            overlong_buffer_cfg=SimpleNamespace(enable=True, len=4, penalty_factor=1.0, log=False))
    verl_rewards = mgr(batch).sum(-1) - 1.0
    ours = dapo.overlong_penalty(lengths, R, 4, 1.0)
    assert ours == pytest.approx(verl_rewards.tolist())
    assert ours == pytest.approx([0.0, 0.0, -0.25, -0.5, -1.0])


def test_decoupled_clip_is_verls_and_clips_only_above_the_high_ratio():
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

    old = torch.zeros(1, 2)
    adv = torch.ones(1, 2)
    mask = torch.ones(1, 2)
    logp = torch.log(torch.tensor([[1.25, 1.25]]))  # ratio 1.25: over 1.2, under 1.28
    lo = algo.policy_loss(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask,
                          alg=AlgorithmConfig(clip_ratio_low=0.2, clip_ratio_high=0.2))[0]
    hi, m = algo.policy_loss(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask,
                             alg=AlgorithmConfig(clip_ratio_low=0.2, clip_ratio_high=0.28))
    assert float(lo) == pytest.approx(-1.2) and float(hi) == pytest.approx(-1.25) and m["pg_clipfrac"] == 0.0
    ref = compute_policy_loss_vanilla(old, logp, adv, mask, loss_agg_mode="token-mean",
                                      config=algo.actor_config(AlgorithmConfig(clip_ratio_high=0.28)))[0]
    assert float(hi) == pytest.approx(float(ref))


def test_token_mean_weights_every_token_equally():
    from verl.trainer.ppo.core_algos import agg_loss

    loss = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    assert float(agg_loss(loss, mask, "token-mean")) == pytest.approx(8 / 5)
    assert float(agg_loss(loss, mask, "seq-mean-token-mean")) == pytest.approx((1 + 4) / 2)


def test_varied_groups_and_concat_pad_rounds_to_one_layout():
    assert dapo.varied_groups([1, 1, 0, 1, 0.05, 0.01, 0, 0], 2) == [1, 2]

    def sampled(P, R, k, tag):
        r = Rollout(torch.full((2 * k, P), 7), torch.ones(2 * k, P, dtype=torch.long), torch.full((2 * k, R), 9),
                    torch.ones(2 * k, R, dtype=torch.long), torch.zeros(2 * k, dtype=torch.bool))
        return dapo.Sampled([tag] * k, r, [1.0, 0.0] * k, [1.0, 0.0] * k, [f"{tag}-{i // 2}" for i in range(2 * k)], 2)

    out = dapo.concat([sampled(3, 2, 1, "a"), sampled(5, 4, 2, "b")], pad_id=0)
    assert out.rollout.prompts.shape == (6, 5) and out.rollout.responses.shape == (6, 4)
    assert out.rollout.prompts[0].tolist() == [0, 0, 7, 7, 7] and out.rollout.prompt_mask[0].tolist() == [0, 0, 1, 1, 1]
    assert out.rollout.responses[0].tolist() == [9, 9, 0, 0] and out.rollout.response_mask[0].tolist() == [1, 1, 0, 0]
    assert out.uids == ["a-0", "a-0", "b-0", "b-0", "b-1", "b-1"] and out.problems == ["a", "b", "b"]


class _Rounds:
    """A stand-in Engine.sample: round k of a step returns the scores of ROUNDS[k]."""

    def __init__(self, rounds, n=2):
        self.rounds, self.n, self.calls = rounds, n, 0

    def __call__(self, problems, gen_seed, uid):
        scores = self.rounds[self.calls]
        self.calls += 1
        k = len(scores) // self.n
        r = Rollout(torch.ones(2 * k, 2, dtype=torch.long), torch.ones(2 * k, 2, dtype=torch.long),
                    torch.ones(2 * k, 3, dtype=torch.long), torch.ones(2 * k, 3, dtype=torch.long),
                    torch.zeros(2 * k, dtype=torch.bool))
        return dapo.Sampled(list(problems), r, scores, scores, [f"{uid}-{i // self.n}" for i in range(len(scores))],
                            self.n)


def _engine(rounds, max_rounds, enable=True):
    cfg = load_recipe("dapo_math", {"trainer.prompts_per_step": 3, "rollout.n": 2,
                                    "algorithm.filter_groups.max_num_gen_batches": max_rounds,
                                    "algorithm.filter_groups.enable": enable})
    eng = object.__new__(Engine)  # only sample_groups' inputs: config, step, source, tokenizer
    eng.cfg, eng.step = cfg, 5
    eng.source = SimpleNamespace(train_batch=lambda step, n, seed: [Problem(f"p{seed}-{i}", "1", "x") for i in range(n)])
    eng.tokenizer = SimpleNamespace(pad_token_id=0)
    eng.sample = _Rounds(rounds)
    first = eng.sample([Problem(f"first-{i}", "1", "x") for i in range(3)], 0, "5")
    return eng, first


def test_dynamic_sampling_refills_with_varied_groups_up_to_the_batch():
    # round 1: group 1 varies; round 2: none; round 3: groups 0 and 2 vary -> 1 + 0 + 2 = 3 groups
    eng, first = _engine([[1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 1, 1], [0, 1, 1, 1, 1, 0]], max_rounds=3)
    got, rounds = eng.sample_groups(first)
    assert len(rounds) == 3 and len(got.problems) == 3
    assert got.problems[0].prompt == "first-1" and got.uids == ["5-1", "5-1", "5.2-0", "5.2-0", "5.2-2", "5.2-2"]
    assert all(max(got.scores[i:i + 2]) > min(got.scores[i:i + 2]) for i in range(0, 6, 2))


def test_dynamic_sampling_stops_when_full_and_trains_short_after_the_last_round():
    eng, first = _engine([[1, 0, 0, 1, 1, 0], [1, 0, 1, 0, 1, 0]], max_rounds=3)
    got, rounds = eng.sample_groups(first)
    assert len(rounds) == 1 and len(got.problems) == 3  # first round already full: no refill
    eng, first = _engine([[1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 0, 1, 0, 1, 0]], max_rounds=2)
    got, rounds = eng.sample_groups(first)
    assert len(rounds) == 2 and len(got.problems) == 1  # bounded: 2 rounds, 1 varied group
    eng, first = _engine([[1, 1, 1, 0, 0, 0]], max_rounds=3, enable=False)
    got, rounds = eng.sample_groups(first)
    assert got is first and len(rounds) == 1  # off: grpo_math's path, the first round as it is


def test_dapo_math_runs_three_steps_with_its_pieces_on(tmp_path, tiny_policy, test_rewards):
    out = tmp_path / "run"
    args = ["rl", "--recipe", "dapo_math", "--out", str(out), "--policy", str(tiny_policy), "--steps", "3",
            "--reward", "rewards_for_tests:starts_with_hash"]
    for k, v in {**SMALL, "trainer.eval_k": 0}.items():
        args += ["--set", f"{k}={v}"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert 1 <= r["gen_batches"] <= 3 and r["groups_kept"] <= 8
        assert -1.0 <= r["overlong_reward"] <= 0.0
        if r["gen_batches"] < 3 and "skipped" not in r:
            assert r["groups_kept"] == 8  # refilled to a full batch before the last round
    assert any("pg_clipfrac" in r for r in rows)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["algorithm"]["clip_ratio_high"] == 0.28 and cfg["algorithm"]["filter_groups"]["enable"] is True


@pytest.mark.parametrize("key,value,match", [
    ("algorithm.filter_groups.max_num_gen_batches", 0, "max_num_gen_batches must be >= 1, got 0"),
    ("algorithm.overlong_buffer.len", 16, r"overlong_buffer.len must be in \[1, data.max_response_length=16\), got 16"),
    ("algorithm.overlong_buffer.penalty_factor", -1.0, "penalty_factor must be >= 0"),
    ("algorithm.filter_groups.enabled", True, "unknown key 'enabled'"),
])
def test_bad_dapo_settings_are_one_line_exit_2(tmp_path, key, value, match):
    from tpu_pipeline.rl.api import prepare_config

    with pytest.raises(UserError, match=match):
        prepare_config("dapo_math", overrides={key: value})
    res = CliRunner().invoke(cli, ["rl", "--recipe", "dapo_math", "--out", str(tmp_path / "r"), "--set", f"{key}={value}"])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
