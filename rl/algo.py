"""GRPO's math, taken from VeRL and wired here (never re-derived).

- advantages: `core_algos.get_adv_estimator_fn(name)` (grpo, rloo; dr_grpo is
  VeRL's grpo with norm_adv_by_std_in_grpo=False and loss_agg_mode
  "seq-mean-token-sum-norm", as VeRL's Dr.GRPO recipe sets it);
- policy loss: `core_algos.get_policy_loss_fn(policy_loss)` with a
  `verl.workers.config.ActorConfig` carrying clip ratios and loss_agg_mode;
- KL: `core_algos.kl_penalty` against a frozen reference, aggregated with
  `core_algos.agg_loss` (VeRL's use_kl_loss path);
- batches: `verl.DataProto`.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from tpu_pipeline.errors import UserError


def _core():
    # heavy: verl's trainer package pulls in ray and hydra (seconds); --engine verl --dry-run never needs it
    from verl.trainer.ppo import core_algos

    return core_algos


def resolve(alg) -> dict:
    """The VeRL names and settings an AlgorithmConfig stands for."""
    if alg.adv_estimator == "dr_grpo":
        return {"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": False,
                "loss_agg_mode": "seq-mean-token-sum-norm"}
    return {"adv_estimator": alg.adv_estimator, "norm_adv_by_std_in_grpo": alg.norm_adv_by_std_in_grpo,
            "loss_agg_mode": alg.loss_agg_mode}


@functools.lru_cache(maxsize=8)
def _actor_config(clip_low: float, clip_high: float, clip_c: float, loss_agg_mode: str, policy_loss: str):
    from verl.workers.config import ActorConfig  # heavy: see _core

    # strategy/batch fields are required by ActorConfig's checks but unused here.
    return ActorConfig(strategy="fsdp", ppo_mini_batch_size=1, ppo_micro_batch_size_per_gpu=1, rollout_n=1,
                       use_dynamic_bsz=False, clip_ratio=clip_low, clip_ratio_low=clip_low,
                       clip_ratio_high=clip_high, clip_ratio_c=clip_c, loss_agg_mode=loss_agg_mode,
                       policy_loss={"loss_mode": policy_loss})


def actor_config(alg):
    r = resolve(alg)
    return _actor_config(alg.clip_ratio_low, alg.clip_ratio_high, alg.clip_ratio_c, r["loss_agg_mode"],
                         alg.policy_loss)


def check(alg) -> None:
    """Fails early, with the valid names, on a name VeRL does not know."""
    core = _core()
    r = resolve(alg)
    try:
        core.get_adv_estimator_fn(r["adv_estimator"])
    except ValueError:
        raise UserError(f"algorithm.adv_estimator {alg.adv_estimator!r} unknown to VeRL; "
                        f"valid: grpo, dr_grpo, rloo, {', '.join(sorted(core.ADV_ESTIMATOR_REGISTRY))}") from None
    try:
        core.get_policy_loss_fn(alg.policy_loss)
    except ValueError:
        raise UserError(f"algorithm.policy_loss {alg.policy_loss!r} unknown to VeRL; "
                        f"valid: {', '.join(sorted(core.POLICY_LOSS_REGISTRY))}") from None
    if alg.use_kl_loss:
        try:
            core.kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), alg.kl_loss_type)
        except (ValueError, NotImplementedError, KeyError):
            raise UserError(f"algorithm.kl_loss_type {alg.kl_loss_type!r} unknown to VeRL; "
                            "valid: kl (k1), abs, mse (k2), low_var_kl (k3), full, with '+' for straight-through") from None


def make_batch(*, prompts, prompt_mask, responses, response_mask, scores: list[float], uids: list[str],
               data_sources: list[str]):
    """A `verl.DataProto` with VeRL's key names; outcome reward on the last response token."""
    from verl import DataProto  # heavy: see _core

    B, R = responses.shape
    rewards = torch.zeros((B, R), dtype=torch.float32)
    last = (response_mask.sum(-1) - 1).clamp(min=0)
    rewards[torch.arange(B), last] = torch.tensor(scores, dtype=torch.float32)
    return DataProto.from_dict(
        tensors={
            "prompts": prompts, "responses": responses,
            "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": torch.cat([prompt_mask, response_mask], 1),
            "response_mask": response_mask.float(),
            "token_level_scores": rewards, "token_level_rewards": rewards.clone(),
        },
        non_tensors={"uid": np.array(uids, dtype=object), "data_source": np.array(data_sources, dtype=object)},
    )


def compute_advantages(batch, alg) -> None:
    """Fills batch["advantages"] and batch["returns"] with VeRL's estimator."""
    r = resolve(alg)
    fn = _core().get_adv_estimator_fn(r["adv_estimator"])
    kwargs = dict(token_level_rewards=batch.batch["token_level_rewards"],
                  response_mask=batch.batch["response_mask"], index=batch.non_tensor_batch["uid"])
    if r["adv_estimator"] == "grpo":
        kwargs["norm_adv_by_std_in_grpo"] = r["norm_adv_by_std_in_grpo"]
    adv, ret = fn(**kwargs)
    batch.batch["advantages"] = adv
    batch.batch["returns"] = ret


def informative_rows(batch) -> np.ndarray:
    """Indices of rows whose group's rewards are not all equal (those carry a gradient
    signal; all-equal groups only add noise through the clip and the KL term)."""
    scores = batch.batch["token_level_rewards"].sum(-1).numpy()
    uids = batch.non_tensor_batch["uid"]
    spread: dict = {}
    for u, s in zip(uids, scores):
        lo, hi = spread.get(u, (s, s))
        spread[u] = (min(lo, s), max(hi, s))
    return np.array([i for i, u in enumerate(uids) if spread[u][1] > spread[u][0]], dtype=np.int64)


def policy_loss(*, old_log_prob, log_prob, advantages, response_mask, alg, ref_log_prob=None):
    """VeRL's policy loss (+ VeRL's KL loss when enabled): (loss, metrics)."""
    core = _core()
    cfg = actor_config(alg)
    loss_fn = core.get_policy_loss_fn(alg.policy_loss)
    pg_loss, metrics = loss_fn(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                               response_mask=response_mask, loss_agg_mode=cfg.loss_agg_mode, config=cfg)
    metrics = {k.split("/")[-1]: float(v) for k, v in metrics.items()}
    metrics["pg_loss"] = float(pg_loss.detach())
    loss = pg_loss
    if alg.use_kl_loss and ref_log_prob is not None:
        kld = core.kl_penalty(logprob=log_prob, ref_logprob=ref_log_prob, kl_penalty=alg.kl_loss_type)
        kl_loss = core.agg_loss(loss_mat=kld, loss_mask=response_mask, loss_agg_mode=cfg.loss_agg_mode)
        loss = pg_loss + alg.kl_loss_coef * kl_loss
        metrics["kl_loss"] = float(kl_loss.detach())
    return loss, metrics


def kl_to_reference(log_prob, ref_log_prob, response_mask, kind: str = "low_var_kl") -> float:
    """The KL estimate reported in metrics (VeRL's kl_penalty, masked mean)."""
    kld = _core().kl_penalty(logprob=log_prob, ref_logprob=ref_log_prob, kl_penalty=kind)
    return float((kld * response_mask).sum() / response_mask.sum().clamp(min=1))
