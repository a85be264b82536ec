"""Countdown (reasoning-gym `countdown`): reach a target with the given numbers,
each used exactly once, with + - * / and parentheses. Task of countdown_lm (the
warm start) and rl's grpo_countdown.

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

    from tpu_pipeline.train import countdown
    d = countdown.Difficulty()                       # 3 numbers 1..9, target 1..30
    train = countdown.make_problems(8000, seed=0, difficulty=d)
    test = countdown.heldout_problems(1000, difficulty=d, exclude=train)
    countdown.score("7-4-2", train[0].numbers, train[0].target)
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
from tpu_pipeline.train.arith import IGNORE

DATA_SOURCE = "countdown"
OPERATORS = ("+", "-", "*", "/")
# Held-out problems come from seeds at and above this one (as in tpu_pipeline.train.arith).
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
    seen = {p.prompt for p in exclude or ()}
    out: list[Problem] = []
    for attempt in range(10):
        # reasoning-gym seeds item i with seed + i: nearby seeds repeat each other's problems.
        for p in _generate(max(n, 64), HELDOUT_SEED + attempt * SEED_STRIDE, difficulty):
            if p.prompt not in seen:
                seen.add(p.prompt)
                out.append(p)
                if len(out) == n:
                    return out
    return out


def fresh_problems(n: int, seed: int, *, difficulty: Difficulty = DEFAULT_DIFFICULTY,
                   exclude: Sequence[Problem] | None = None) -> list[Problem]:
    """`n` problems for a seed of the caller's choice (`eval --seed`), from generator seeds
    neither training (< HELDOUT_SEED) nor the held-out split use, prompts in `exclude` dropped."""
    seen = {p.prompt for p in exclude or ()}
    out: list[Problem] = []
    for attempt in range(10):
        for p in _generate(max(n, 64), 2 * HELDOUT_SEED + (10 * seed + attempt) * SEED_STRIDE, difficulty):
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


def encode_example(tokenizer, problem: Problem) -> tuple[list[int], int]:
    """Token ids of BOS + prompt + solution + EOS, and the prompt length (BOS included)."""
    prompt = tokenizer(problem.prompt)["input_ids"]
    target = tokenizer(problem.solution, add_special_tokens=False)["input_ids"]
    return prompt + target + [tokenizer.eos_token_id], len(prompt)


def lm_batch(tokenizer, problems: Sequence[Problem], seq_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, labels) right-padded; only solution tokens + EOS count (as arith.lm_batch)."""
    encoded = [encode_example(tokenizer, p) for p in problems]
    L = seq_len or max(len(ids) for ids, _ in encoded)
    ids = torch.full((len(encoded), L), tokenizer.pad_token_id, dtype=torch.int64)
    labels = torch.full((len(encoded), L), IGNORE, dtype=torch.int64)
    for i, (x, n_prompt) in enumerate(encoded):
        ids[i, : len(x)] = torch.tensor(x)
        labels[i, n_prompt - 1: len(x) - 1] = torch.tensor(x[n_prompt:])
    return ids, labels
