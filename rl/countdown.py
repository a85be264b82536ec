"""grpo_countdown's task in rl: reasoning-gym countdown problems as VeRL rows, the
verifier as the reward, and the supervised control of its report.

    tpu-pipeline rl --recipe grpo_countdown        # CPU: ~10 min, warm start included

Rows: prompt `"2 7 4#1="` (tpu_pipeline.train.countdown, the warm start's own
format), ground_truth the target, extra_info the numbers, data_source
"countdown". The reward is reasoning-gym's verifier alone
(`CountdownDataset.score_answer`: 1.0 solved, 0.05 parsed but wrong, 0.01
otherwise); success counts 1.0 only. Any correct expression earns it, not only
the generator's solution the warm start imitated.

Splits: the held-out problems are fixed (reasoning-gym seeds training never
uses) and exclude every prompt of the seed-0 pool of data.pool_size problems,
which is the warm start's training set (rl/policy.py sets countdown_lm's
n_train to it): held-out success measures problems neither the warm start nor
RL saw. RL samples its prompts from the pool of its own trainer.seed (held-out
prompts removed).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from tpu_pipeline.errors import UserError
from tpu_pipeline.rl.control import supervised_steps
from tpu_pipeline.rl.data import TASK_SOURCES, Problem, _seed
from tpu_pipeline.rl.evaluate import evaluate
from tpu_pipeline.rl.policy import build_optimizer, load_policy
from tpu_pipeline.rl.rewards import GuardedReward, load_reward
from tpu_pipeline.train import countdown

TASK = countdown.DATA_SOURCE


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs) -> float:
    """reasoning-gym's countdown verifier (VeRL's compute_score signature): numbers from
    extra_info["numbers"], target from ground_truth."""
    numbers = (extra_info or {}).get("numbers") if isinstance(extra_info, dict) else None
    if numbers is None:
        raise UserError("countdown reward: extra_info['numbers'] is missing (rows from tpu_pipeline.rl.countdown carry it)")
    return countdown.score(solution_str, [int(x) for x in numbers], int(ground_truth))


def difficulty(data_cfg) -> countdown.Difficulty:
    """data.difficulty typed for countdown (unknown keys and bad values: UserError)."""
    return countdown.Difficulty.from_dict(data_cfg.difficulty)


def to_problem(p: countdown.Problem) -> Problem:
    return Problem(p.prompt, str(p.target), TASK, "countdown",
                   {"numbers": list(p.numbers), "target": p.target, "solution": p.solution})


class CountdownSource:
    def __init__(self, diff: countdown.Difficulty, heldout_n: int, seed: int, pool_n: int):
        self.difficulty, self.heldout_n, self.seed, self.pool_n = diff, heldout_n, seed, pool_n
        self._heldout: list[Problem] | None = None
        self._pool: list[countdown.Problem] | None = None

    def heldout_raw(self) -> list[countdown.Problem]:
        seen = countdown.make_problems(self.pool_n, 0, difficulty=self.difficulty)
        return countdown.heldout_problems(self.heldout_n, difficulty=self.difficulty, exclude=seen)

    def heldout(self) -> list[Problem]:
        if self._heldout is None:
            self._heldout = [to_problem(p) for p in self.heldout_raw()]
        return self._heldout

    def pool(self) -> list[countdown.Problem]:
        """This seed's training problems (held-out prompts removed)."""
        if self._pool is None:
            banned = {p.prompt for p in self.heldout()}
            self._pool = [p for p in countdown.make_problems(self.pool_n, self.seed % countdown.HELDOUT_SEED,
                                                             difficulty=self.difficulty) if p.prompt not in banned]
            if not self._pool:
                raise UserError("countdown: every training problem is a held-out one; make the task harder")
        return self._pool

    def fresh(self, n: int, seed: int) -> list[Problem]:
        """Problems for a seed of the caller's choice (`eval --seed`): generator seeds training
        and the held-out split never use, and no prompt of the warm start's seed-0 pool (the
        problem space is small: ~2,600 distinct prompts in 4,000 draws)."""
        seen = countdown.make_problems(self.pool_n, 0, difficulty=self.difficulty)
        return [to_problem(p) for p in countdown.fresh_problems(n, seed, difficulty=self.difficulty, exclude=seen)]

    def train_batch(self, step: int, n: int, seed: int) -> list[Problem]:
        """`n` prompts of the pool for `step` (a seeded draw: the batch depends only on (seed, step))."""
        rng = random.Random(_seed("countdown", seed, step))
        pool = self.pool()
        return [to_problem(pool[rng.randrange(len(pool))]) for _ in range(n)]


def _source(data_cfg, seed: int) -> CountdownSource:
    if list(data_cfg.tasks) != [TASK]:
        raise UserError(f"rl data: countdown does not mix with other tasks, got {list(data_cfg.tasks)}")
    if data_cfg.pool_size < 1:
        raise UserError(f"data.pool_size must be >= 1, got {data_cfg.pool_size}")
    return CountdownSource(difficulty(data_cfg), data_cfg.heldout_n, seed, data_cfg.pool_size)


TASK_SOURCES[TASK] = _source


def supervised_control(cfg, warm_start_dir: str | Path, seconds: float, *, lr: float = 1e-4, batch_size: int = 64,
                       k: int = 0) -> dict:
    """grpo_countdown's control: the warm start continued by supervision on the pool's one
    solution per problem for `seconds` (AdamW moments carried, countdown_lm's loss), then
    evaluated on the same held-out split as RL (as tpu_pipeline.rl.control does for grpo_math)."""
    ws = Path(warm_start_dir)
    model, tok = load_policy(ws / "hf")
    opt, carried = build_optimizer(model, lr=lr, weight_decay=0.0, carry_from=ws / "optimizer.pt")
    source = _source(cfg.data, cfg.trainer.seed)
    heldout = source.heldout()
    pool = source.pool()
    guard = GuardedReward(load_reward(cfg.trainer.reward), cfg.trainer.reward_timeout_s)
    rng = random.Random(_seed("control", cfg.trainer.seed))
    try:
        steps, trained = supervised_steps(
            model, opt, lambda _: countdown.lm_batch(tok, [pool[rng.randrange(len(pool))] for _ in range(batch_size)]),
            seconds, ws)
        d = cfg.data
        res = evaluate(model, tok, heldout, lambda items: guard(items).scores, max_prompt_length=d.max_prompt_length,
                       max_response_length=d.max_response_length, overlong=d.overlong_prompt, k=k,
                       temperature=cfg.trainer.eval_temperature)
    finally:
        guard.close()
    return {**res, "steps": steps, "seconds_trained": round(trained, 1), "lr": lr, "batch_size": batch_size,
            "optimizer_state_carried": carried}
