"""Countdown (reasoning-gym `countdown`): reach a target with the given numbers,
each used exactly once, with + - * / and parentheses. Holds the supervised
train task `countdown_lm`, the rl source `countdown` and reward `countdown`
(grpo_countdown).

Problems come from reasoning-gym's offline generator; each is rendered compactly
as a prompt `"2 7 4#1="` (numbers, '#', target, '='), and the model answers with
an expression, `"7-4-2"` then EOS. Many expressions are correct, so the score is
reasoning-gym's verifier alone (`CountdownDataset.score_answer`): 1.0 when the
expression uses exactly the given numbers and reaches the target, 0.05 when it
parses but misses, 0.01 otherwise. Supervision sees one solution per problem
(the generator's); RL is rewarded for any.

The generator runs sympy for every problem (5-17 ms each on one core of the
shared box), so problem pools are cached per (n, seed, difficulty): in memory,
and on disk under $TPU_PIPELINE_HOME/data (a first run generates, later runs read).

    from tpu_pipeline.train.tasks import countdown
    d = countdown.Difficulty()                       # 3 numbers 1..9, target 1..30
    train = countdown.make_problems(8000, seed=0, difficulty=d)
    test = countdown.heldout_problems(1000, difficulty=d, exclude=train)
    countdown.score("7-4-2", train[0].numbers, train[0].target)

rl rows: prompt as above, ground_truth the target, extra_info the numbers,
data_source "countdown"; success counts 1.0 only. Splits: the held-out
problems are fixed (reasoning-gym seeds training never uses) and exclude every
prompt of the seed-0 pool of data.options.pool_size problems, which is the warm
start's training set (`warm_start_overrides` sets countdown_lm's n_train to
it): held-out success measures problems neither the warm start nor RL saw. RL
samples its prompts from the pool of its own trainer.seed (held-out prompts
removed).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from tpu_pipeline import config
from tpu_pipeline.errors import UserError
from tpu_pipeline.files import atomic_write_json
from tpu_pipeline.train.tasks import char_lm
from tpu_pipeline.train.tasks.base import REWARDS, TASK_SOURCES, TASKS, TaskSource
from tpu_pipeline.train.tasks.char_lm import CharLMTask, ModelConfig
from tpu_pipeline.train.tasks.rows import Problem as Row
from tpu_pipeline.train.tasks.rows import stable_seed

DATA_SOURCE = "countdown"
OPERATORS = ("+", "-", "*", "/")
# Held-out problems come from seeds at and above this one (as in tpu_pipeline.train.tasks.arith).
HELDOUT_SEED = 1_000_000_000
# Distance between the generator seeds of successive held-out draws (more than any draw's size).
SEED_STRIDE = 10_000_000


@dataclasses.dataclass(frozen=True, kw_only=True)
class Difficulty:
    """reasoning-gym CountdownConfig's knobs. The default (3 numbers 1..9, targets 1..30,
    all four operators) leaves a short warm start far below its pass@8, the regime where
    GRPO has signal (docs/BENCHMARKS.md)."""

    min_numbers: int = 3
    max_numbers: int = 3
    min_value: int = 1
    max_value: int = 9
    min_target: int = 1
    max_target: int = 30
    operators: tuple[str, ...] = OPERATORS

    def __post_init__(self):
        object.__setattr__(self, "operators", tuple(self.operators))
        if not 2 <= self.min_numbers <= self.max_numbers:
            raise UserError(f"countdown difficulty: need 2 <= min_numbers <= max_numbers, got "
                            f"{self.min_numbers}..{self.max_numbers}")
        if not 1 <= self.min_value <= self.max_value:
            raise UserError(f"countdown difficulty: need 1 <= min_value <= max_value, got {self.min_value}..{self.max_value}")
        if not 1 <= self.min_target <= self.max_target:
            raise UserError(f"countdown difficulty: need 1 <= min_target <= max_target, got "
                            f"{self.min_target}..{self.max_target}")
        if not self.operators or set(self.operators) - set(OPERATORS):
            raise UserError(f"countdown difficulty: operators must be a non-empty subset of + - * /, got {list(self.operators)}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Difficulty":
        """From a recipe's difficulty table, through the one config system (unknown keys refused)."""
        return config.build(cls, dict(d), "countdown difficulty")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


DEFAULT_DIFFICULTY = Difficulty()


@dataclasses.dataclass(frozen=True)
class Problem:
    numbers: tuple[int, ...]
    target: int
    solution: str       # the generator's expression, spaces removed: what supervision imitates

    @property
    def prompt(self) -> str:
        return f"{' '.join(map(str, self.numbers))}#{self.target}="


def _cache_file(n: int, seed: int, d: Difficulty) -> Path:
    home = Path(os.environ.get("TPU_PIPELINE_HOME", Path.home() / ".cache" / "tpu-pipeline"))
    key = hashlib.sha256(json.dumps([n, seed, d.to_dict()], sort_keys=True).encode()).hexdigest()[:16]
    return home / "data" / f"countdown-{key}.json"


@functools.lru_cache(maxsize=16)
def _generate(n: int, seed: int, d: Difficulty) -> tuple[Problem, ...]:
    path = _cache_file(n, seed, d)
    try:
        rows = json.loads(path.read_text())
        return tuple(Problem(tuple(r[0]), int(r[1]), str(r[2])) for r in rows)
    except (OSError, ValueError, TypeError, IndexError):  # absent or damaged: generate again
        pass
    out = _run_generator(n, seed, d)
    atomic_write_json(path, [[list(p.numbers), p.target, p.solution] for p in out])
    return out


def _run_generator(n: int, seed: int, d: Difficulty) -> tuple[Problem, ...]:
    # heavy: reasoning_gym imports every task family it ships (~1 s)
    import reasoning_gym

    try:
        ds = reasoning_gym.create_dataset(DATA_SOURCE, size=n, seed=seed, min_numbers=d.min_numbers,
                                          max_numbers=d.max_numbers, min_value=d.min_value, max_value=d.max_value,
                                          min_target=d.min_target, max_target=d.max_target,
                                          operators=d.operators)
        return tuple(Problem(tuple(x["metadata"]["numbers"]), int(x["metadata"]["target"]),
                             x["metadata"]["expression"].replace(" ", "")) for x in ds)
    except ValueError as e:  # the generator gives up on targets it cannot reach
        raise UserError(f"countdown difficulty {d.to_dict()}: reasoning-gym cannot generate it ({e})") from None


def make_problems(n: int, seed: int, *, difficulty: Difficulty = DEFAULT_DIFFICULTY) -> list[Problem]:
    """`n` training problems for `seed` (shuffled, so a prefix is a fair sample)."""
    if n < 0:
        raise UserError(f"countdown: n must be >= 0, got {n}")
    if not 0 <= seed < HELDOUT_SEED:
        raise UserError(f"countdown: training seed must be in [0, {HELDOUT_SEED}), got {seed}")
    out = list(_generate(n, seed, difficulty))
    random.Random(seed).shuffle(out)
    return out


def heldout_problems(n: int, *, difficulty: Difficulty = DEFAULT_DIFFICULTY,
                     exclude: Sequence[Problem] | None = None) -> list[Problem]:
    """`n` held-out problems from a seed training never uses; prompts in `exclude` are
    dropped (small problem spaces may then yield fewer than `n`)."""
    # reasoning-gym seeds item i with seed + i: nearby seeds repeat each other's problems.
    return _distinct(n, [HELDOUT_SEED + attempt * SEED_STRIDE for attempt in range(10)], difficulty, exclude)


def fresh_problems(n: int, seed: int, *, difficulty: Difficulty = DEFAULT_DIFFICULTY,
                   exclude: Sequence[Problem] | None = None) -> list[Problem]:
    """`n` problems for a seed of the caller's choice (`eval --seed`), from generator seeds
    neither training (< HELDOUT_SEED) nor the held-out split use, prompts in `exclude` dropped."""
    return _distinct(n, [2 * HELDOUT_SEED + (10 * seed + attempt) * SEED_STRIDE for attempt in range(10)],
                     difficulty, exclude)


def _distinct(n: int, seeds: Sequence[int], difficulty: Difficulty, exclude: Sequence[Problem] | None) -> list[Problem]:
    """Up to `n` problems with distinct prompts, none in `exclude`, drawn from `seeds` in turn."""
    seen = {p.prompt for p in exclude or ()}
    out: list[Problem] = []
    for seed in seeds:
        for p in _generate(max(n, 64), seed, difficulty):
            if p.prompt not in seen:
                seen.add(p.prompt)
                out.append(p)
                if len(out) == n:
                    return out
    return out


@functools.lru_cache(maxsize=1)
def _verifier():
    # heavy: see _generate
    from reasoning_gym.games.countdown import CountdownConfig, CountdownDataset

    # score_answer reads only the entry it is given; the instance's own config is unused.
    return CountdownDataset(CountdownConfig(size=1, seed=0))


def score(answer: str, numbers: Sequence[int], target: int) -> float:
    """reasoning-gym's countdown verifier (CountdownDataset.score_answer)."""
    return _score(answer.strip(), tuple(int(x) for x in numbers), int(target))


# The verifier parses with sympy (~5 ms a call on the shared box) and is deterministic;
# a group's samples often repeat an expression, and prompts recur across steps.
@functools.lru_cache(maxsize=1 << 16)
def _score(answer: str, numbers: tuple[int, ...], target: int) -> float:
    entry = {"metadata": {"numbers": list(numbers), "target": target}}
    return float(_verifier().score_answer(answer, entry))


def lm_batch(tokenizer, problems: Sequence[Problem], seq_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, labels) right-padded; only solution tokens + EOS count (char_lm.lm_batch)."""
    return char_lm.lm_batch(tokenizer, [(p.prompt, p.solution) for p in problems], seq_len)


@REWARDS.register("countdown")
def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs) -> float:
    """reasoning-gym's countdown verifier (VeRL's compute_score signature): numbers from
    extra_info["numbers"], target from ground_truth."""
    numbers = (extra_info or {}).get("numbers") if isinstance(extra_info, dict) else None
    if numbers is None:
        raise UserError("countdown reward: extra_info['numbers'] is missing (rows of the countdown source carry it)")
    return score(solution_str, [int(x) for x in numbers], int(ground_truth))


@dataclasses.dataclass(kw_only=True)
class CountdownConfig(ModelConfig):
    """The `[countdown]` table of a countdown_lm recipe."""

    n_train: int = 4000              # training problems, one solution each (sampled with replacement per step)
    n_heldout: int = 1000            # held-out problems for eval.json (deduplicated against training)
    min_numbers: int = 3             # fewest numbers per problem
    max_numbers: int = 3             # most numbers per problem
    min_value: int = 1               # smallest number
    max_value: int = 9               # largest number
    min_target: int = 1              # smallest target
    max_target: int = 30             # largest target
    operators: list[str] = dataclasses.field(default_factory=lambda: list(OPERATORS))  # subset of + - * /

    def difficulty(self) -> Difficulty:
        return Difficulty(**{k: getattr(self, k) for k in (
            "min_numbers", "max_numbers", "min_value", "max_value", "min_target", "max_target")},
            operators=tuple(self.operators))

    def check(self, section: str) -> None:
        if self.n_train < 1 or self.n_heldout < 1:
            raise UserError(f"{section}.n_train and {section}.n_heldout must be >= 1")
        super().check(section)
        self.difficulty()


@TASKS.register("countdown_lm")
class CountdownTask(CharLMTask):
    """The char-level Llama supervised on one countdown solution per problem; the warm start of
    grpo_countdown. Greedy success and pass@k by reasoning-gym's verifier."""

    section = "countdown"
    Config = CountdownConfig
    # Trained and measured (docs/BENCHMARKS.md) without --kernels routing; arith_lm has it.
    uses_kernels = False
    metric = "greedy success (reasoning-gym countdown verifier)"
    answer_slack = 4

    def problems(self):
        c = self.config
        train = make_problems(c.n_train, seed=self.seed, difficulty=c.difficulty())
        return train, heldout_problems(c.n_heldout, difficulty=c.difficulty(), exclude=train)

    def target(self, problem: Problem) -> str:
        return problem.solution

    def correct(self, completion: str, problem: Problem) -> float:
        return float(score(completion, problem.numbers, problem.target) >= 1.0)

    def example(self, problem: Problem, completion: str) -> dict:
        return {"prompt": problem.prompt, "completion": completion, "solution": problem.solution}


@dataclasses.dataclass(kw_only=True)
class CountdownOptions:
    """`data.options` of an rl recipe on the countdown source."""

    pool_size: int = 4000  # training problems per seed (the warm start's n_train), generated once and cached


def to_row(p: Problem) -> Row:
    return Row(p.prompt, str(p.target), DATA_SOURCE, "countdown",
               {"numbers": list(p.numbers), "target": p.target, "solution": p.solution})


@TASK_SOURCES.register("countdown")
class CountdownSource(TaskSource):
    """reasoning-gym countdown problems, rewarded by the verifier alone (any correct expression)."""

    Difficulty = Difficulty
    Options = CountdownOptions

    def __init__(self, diff: Difficulty, heldout_n: int, seed: int, pool_n: int):
        self.difficulty, self.heldout_n, self.seed, self.pool_n = diff, heldout_n, seed, pool_n
        self._heldout: list[Row] | None = None
        self._pool: list[Problem] | None = None

    @classmethod
    def options(cls, data_cfg) -> CountdownOptions:
        opts = super().options(data_cfg)
        if opts.pool_size < 1:
            raise UserError(f"data.options.pool_size must be >= 1, got {opts.pool_size}")
        return opts

    @classmethod
    def from_config(cls, data_cfg, seed: int) -> "CountdownSource":
        pool = cls.options(data_cfg).pool_size
        return cls(Difficulty.from_dict(data_cfg.difficulty), data_cfg.heldout_n, seed, pool)

    @classmethod
    def warm_start_overrides(cls, data_cfg) -> dict[str, Any]:
        # The warm start trains on exactly rl's seed-0 pool, at rl's difficulty.
        ov: dict[str, Any] = {f"{CountdownTask.section}.n_train": cls.options(data_cfg).pool_size}
        for k, v in data_cfg.difficulty.items():
            ov[f"{CountdownTask.section}.{k}"] = list(v) if isinstance(v, (list, tuple)) else v
        return ov

    def heldout_raw(self) -> list[Problem]:
        seen = make_problems(self.pool_n, 0, difficulty=self.difficulty)
        return heldout_problems(self.heldout_n, difficulty=self.difficulty, exclude=seen)

    def heldout(self) -> list[Row]:
        if self._heldout is None:
            self._heldout = [to_row(p) for p in self.heldout_raw()]
        return self._heldout

    def pool(self) -> list[Problem]:
        """This seed's training problems (held-out prompts removed)."""
        if self._pool is None:
            banned = {p.prompt for p in self.heldout()}
            self._pool = [p for p in make_problems(self.pool_n, self.seed % HELDOUT_SEED, difficulty=self.difficulty)
                          if p.prompt not in banned]
            if not self._pool:
                raise UserError("countdown: every training problem is a held-out one; make the task harder")
        return self._pool

    def fresh(self, n: int, seed: int) -> list[Row]:
        """Generator seeds training and the held-out split never use, and no prompt of the warm
        start's seed-0 pool (the problem space is small: ~2,600 distinct prompts in 4,000 draws)."""
        seen = make_problems(self.pool_n, 0, difficulty=self.difficulty)
        return [to_row(p) for p in fresh_problems(n, seed, difficulty=self.difficulty, exclude=seen)]

    def train_batch(self, step: int, n: int, seed: int) -> list[Row]:
        """`n` prompts of the pool for `step` (a seeded draw: the batch depends only on (seed, step))."""
        rng = random.Random(stable_seed("countdown", seed, step))
        pool = self.pool()
        return [to_row(pool[rng.randrange(len(pool))]) for _ in range(n)]

    def supervised_batches(self, tokenizer, batch_size: int, seed: int):
        """countdown_lm's batches on the pool's one solution per problem."""
        pool = self.pool()
        rng = random.Random(stable_seed("control", seed))
        return lambda _step: lm_batch(tokenizer, [pool[rng.randrange(len(pool))] for _ in range(batch_size)])
