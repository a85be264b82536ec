"""The local engine's math is VeRL's: each wiring checked against VeRL's own
functions called directly, and against values worked out by hand."""

from __future__ import annotations

import pytest
import torch

from tpu_pipeline.errors import UserError
from tpu_pipeline.rl import algo
from tpu_pipeline.rl.recipe import AlgorithmConfig


def _batch(scores, n, R=3, lengths=None):
    B = len(scores)
    lengths = lengths or [R] * B
    mask = torch.tensor([[1] * L + [0] * (R - L) for L in lengths])
    return algo.make_batch(prompts=torch.ones(B, 2, dtype=torch.long), prompt_mask=torch.ones(B, 2, dtype=torch.long),
                           responses=torch.ones(B, R, dtype=torch.long), response_mask=mask, scores=scores,
                           uids=[f"g{i // n}" for i in range(B)], data_sources=["x"] * B)


def test_batch_is_a_verl_dataproto_with_reward_on_the_last_token():
    from verl import DataProto

    b = _batch([1.0, 0.0], n=2, lengths=[2, 3])
    assert isinstance(b, DataProto)
    assert b.batch["token_level_rewards"].tolist() == [[0, 1, 0], [0, 0, 0]]
    assert list(b.non_tensor_batch["uid"]) == ["g0", "g0"]


def test_grpo_advantages_are_verls_and_std_normalised():
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    scores = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    b = _batch(scores, n=4)
    algo.compute_advantages(b, AlgorithmConfig(adv_estimator="grpo"))
    ref, _ = compute_grpo_outcome_advantage(_batch(scores, 4).batch["token_level_rewards"],
                                            b.batch["response_mask"], b.non_tensor_batch["uid"])
    assert torch.equal(b.batch["advantages"], ref)
    # group 0: mean 0.25, std (unbiased) 0.5 -> (1 - 0.25) / 0.5 = 1.5
    assert b.batch["advantages"][0, 0].item() == pytest.approx(1.5, abs=1e-4)
    assert b.batch["advantages"][1, 0].item() == pytest.approx(-0.5, abs=1e-4)


def test_dr_grpo_is_verls_grpo_without_std_and_with_seq_mean_token_sum_norm():
    b = _batch([1.0, 0.0, 0.0, 0.0], n=4)
    alg = AlgorithmConfig(adv_estimator="dr_grpo")
    algo.compute_advantages(b, alg)
    assert b.batch["advantages"][0, 0].item() == pytest.approx(0.75)
    assert algo.resolve(alg)["loss_agg_mode"] == "seq-mean-token-sum-norm"
    assert algo.actor_config(alg).loss_agg_mode == "seq-mean-token-sum-norm"


def test_rloo_advantages():
    b = _batch([1.0, 0.0, 0.0, 0.0], n=4)
    algo.compute_advantages(b, AlgorithmConfig(adv_estimator="rloo"))
    # leave-one-out: 1 - mean(0,0,0) = 1; 0 - mean(1,0,0) = -1/3
    assert b.batch["advantages"][0, 0].item() == pytest.approx(1.0)
    assert b.batch["advantages"][1, 0].item() == pytest.approx(-1 / 3)


def test_uniform_groups_are_dropped():
    b = _batch([1.0, 1.0, 0.0, 1.0, 0.0, 0.0], n=2)
    assert algo.informative_rows(b).tolist() == [2, 3]


def test_policy_loss_is_verls_vanilla_with_our_actor_config():
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

    torch.manual_seed(0)
    old = torch.randn(4, 5) * 0.1 - 1
    new = (old + torch.randn(4, 5) * 0.5).requires_grad_()
    adv = torch.randn(4, 1).expand(4, 5).contiguous()
    mask = torch.tensor([[1, 1, 1, 0, 0]] * 4, dtype=torch.float32)
    alg = AlgorithmConfig(clip_ratio_low=0.2, clip_ratio_high=0.28)
    loss, metrics = algo.policy_loss(old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask, alg=alg)
    ref, _ = compute_policy_loss_vanilla(old, new, adv, mask, "token-mean", config=algo.actor_config(alg))
    assert torch.allclose(loss, ref)
    assert 0.0 < metrics["pg_clipfrac"] < 1.0
    loss.backward()
    assert new.grad[:, 3:].abs().sum() == 0  # masked tokens carry no gradient


def test_on_policy_gradient_points_along_the_advantage():
    logp = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    loss, _ = algo.policy_loss(old_log_prob=logp.detach(), log_prob=logp, advantages=adv,
                               response_mask=torch.ones(2, 2), alg=AlgorithmConfig())
    loss.backward()
    assert (logp.grad[0] < 0).all() and (logp.grad[1] > 0).all()  # descent raises good, lowers bad


def test_kl_loss_uses_verls_kl_penalty_and_agg_loss():
    from verl.trainer.ppo.core_algos import agg_loss, kl_penalty

    logp = torch.tensor([[-1.0, -2.0, -0.5]])
    ref = torch.tensor([[-1.5, -1.0, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    alg = AlgorithmConfig(use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="low_var_kl")
    loss, m = algo.policy_loss(old_log_prob=logp, log_prob=logp, advantages=torch.zeros(1, 3), response_mask=mask,
                               alg=alg, ref_log_prob=ref)
    expect = agg_loss(kl_penalty(logp, ref, "low_var_kl"), mask, "token-mean")
    assert m["kl_loss"] == pytest.approx(float(expect))
    assert float(loss) == pytest.approx(0.1 * float(expect))
    assert m["kl_loss"] > 0


@pytest.mark.parametrize("field,value,valid", [("adv_estimator", "nope", "grpo"), ("policy_loss", "nope", "vanilla")])
def test_unknown_names_list_the_valid_ones(field, value, valid):
    alg = AlgorithmConfig()
    object.__setattr__(alg, field, value)
    with pytest.raises(UserError) as e:
        algo.check(alg)
    assert valid in str(e.value)
