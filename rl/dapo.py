"""DAPO's pieces beside VeRL's loss functions (Yu et al. 2025, "DAPO: an open-source
LLM reinforcement learning system at scale"), as VeRL implements them:

- soft overlong punishment: VeRL computes it inline in `DAPORewardManager.__call__`
  (verl/workers/reward_manager/dapo.py, verl 0.9.1); `overlong_penalty` is that
  line as a function (tests compare it with the manager on the same batch);
- dynamic sampling: VeRL's DAPO trainer keeps the groups whose verifier score
  (metric "acc") varies and generates more batches until the batch is full;
  `varied_groups` is the filter, `Sampled` and `concat` hold the rounds, and the
  engine's sampling step (`Engine.sample_groups`) runs the rounds.

Decoupled clip (clip_ratio_low/high) and token-level aggregation ("token-mean")
are VeRL's `core_algos` policy loss and `agg_loss`, through tpu_pipeline.rl.algo.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from tpu_pipeline.errors import UserError
from tpu_pipeline.rl.rollout import Rollout


def check(cfg) -> None:
    """The DAPO settings of an RLConfig that cannot work, as one-line UserErrors."""
    fg, ob, R = cfg.algorithm.filter_groups, cfg.algorithm.overlong_buffer, cfg.data.max_response_length
    if fg.max_num_gen_batches < 1:
        raise UserError(f"recipe {cfg.name}: algorithm.filter_groups.max_num_gen_batches must be >= 1, "
                        f"got {fg.max_num_gen_batches}")
    if ob.enable and not 0 < ob.len < R:
        raise UserError(f"recipe {cfg.name}: algorithm.overlong_buffer.len must be in [1, data.max_response_length"
                        f"={R}), got {ob.len}")
    if ob.enable and ob.penalty_factor < 0:
        raise UserError(f"recipe {cfg.name}: algorithm.overlong_buffer.penalty_factor must be >= 0, "
                        f"got {ob.penalty_factor}")


def overlong_penalty(lengths: Sequence[int], max_resp_len: int, buffer_len: int, penalty_factor: float) -> list[float]:
    """Reward added to each response of `lengths` tokens (EOS included, as VeRL's
    valid_response_length): 0 up to max_resp_len - buffer_len tokens, then falling
    linearly to -penalty_factor at max_resp_len."""
    expected = max_resp_len - buffer_len
    return [min(-(int(n) - expected) / buffer_len * penalty_factor, 0.0) for n in lengths]


def varied_groups(scores: Sequence[float], n: int) -> list[int]:
    """Indices of the groups of `n` consecutive samples whose scores are not all equal."""
    return [g for g in range(len(scores) // n) if max(scores[g * n:(g + 1) * n]) > min(scores[g * n:(g + 1) * n])]


@dataclass
class Sampled:
    """One generation round: its prompts, their n samples each, and the samples' scores
    (`scores` from the verifier, `rewards` after shaping: what advantages are computed on)."""

    problems: list
    rollout: Rollout
    scores: list[float]
    rewards: list[float]
    uids: list[str]
    n: int
    errors: int = 0
    timeouts: int = 0
    first_error: str = ""
    extra: dict = field(default_factory=dict)

    def select(self, groups: Sequence[int]) -> "Sampled":
        n = self.n
        rows = [g * n + j for g in groups for j in range(n)]
        idx = torch.tensor(rows, dtype=torch.long)
        r = self.rollout
        pick = (lambda t: t[idx.to(t.device)])
        return Sampled([self.problems[g] for g in groups],
                       Rollout(pick(r.prompts), pick(r.prompt_mask), pick(r.responses), pick(r.response_mask),
                               pick(r.truncated)),
                       [self.scores[i] for i in rows], [self.rewards[i] for i in rows], [self.uids[i] for i in rows],
                       n, self.errors, self.timeouts, self.first_error, dict(self.extra))


def _pad(t: torch.Tensor, width: int, value: int, left: bool) -> torch.Tensor:
    extra = width - t.shape[1]
    if extra <= 0:
        return t
    fill = torch.full((t.shape[0], extra), value, dtype=t.dtype, device=t.device)
    return torch.cat([fill, t] if left else [t, fill], dim=1)


def concat(parts: Sequence[Sampled], pad_id: int) -> Sampled:
    """Rounds of one step as one batch: prompts left-padded and responses right-padded
    to the widest round (the layout generate() returns)."""
    P = max(p.rollout.prompts.shape[1] for p in parts)
    R = max(p.rollout.responses.shape[1] for p in parts)
    r = Rollout(torch.cat([_pad(p.rollout.prompts, P, pad_id, True) for p in parts]),
                torch.cat([_pad(p.rollout.prompt_mask, P, 0, True) for p in parts]),
                torch.cat([_pad(p.rollout.responses, R, pad_id, False) for p in parts]),
                torch.cat([_pad(p.rollout.response_mask, R, 0, False) for p in parts]),
                torch.cat([p.rollout.truncated for p in parts]))
    return Sampled([q for p in parts for q in p.problems], r, [s for p in parts for s in p.scores],
                   [s for p in parts for s in p.rewards], [u for p in parts for u in p.uids], parts[0].n,
                   sum(p.errors for p in parts), sum(p.timeouts for p in parts),
                   next((p.first_error for p in parts if p.first_error), ""))
