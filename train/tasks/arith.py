"""The arithmetic task: reasoning-gym problems, their `#### N` format and verifier,
the supervised `arith_lm` train task and the rl source `arith` (grpo_math, dapo_math).

Problems come from reasoning-gym's offline generators (`basic_arithmetic`,
`chain_sum`); each is rendered compactly as a prompt `"3+4-2="`, and the
model is trained to continue with `"#### 5"` then EOS: the form VeRL's
gsm8k scorer (strict) reads. The model is the char-level Llama of
`tpu_pipeline.train.tasks.char_lm`.

    from tpu_pipeline.train.tasks import arith
    d = arith.Difficulty(max_terms=4)                  # typed; the default is DEFAULT_DIFFICULTY
    train = arith.make_problems(10_000, seed=0, difficulty=d)   # [Problem(prompt, answer, data_source)]
    test = arith.heldout_problems(1000, difficulty=d, exclude=train)

arith_lm (`ArithTask`) is the warm start of grpo_math: supervised next-token
loss on `#### N` + EOS; evaluation is greedy exact match (VeRL's gsm8k
scorer, strict) on held-out problems, plus pass@k at temperature 1.

The rl source (`ArithSource`) draws from the same generators: a fixed
held-out split (the held-out seed), training batches that never contain a
held-out prompt, and the "unseen" split (held-out prompts the warm start
never trained on either). Its tasks may also name `gsm_symbolic` (word
problems from tpu_pipeline.train.tasks.gsm8k: for a real model on bigger
hardware, not the char-level warm start).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Mapping, Sequence

import torch

from tpu_pipeline import config
from tpu_pipeline.errors import UserError
from tpu_pipeline.train.tasks import char_lm, gsm8k
from tpu_pipeline.train.tasks.base import TASK_SOURCES, TASKS, TaskSource
from tpu_pipeline.train.tasks.char_lm import CharLMTask, ModelConfig
from tpu_pipeline.train.tasks.rows import Problem as Row
from tpu_pipeline.train.tasks.rows import stable_seed

GYM_TASKS = ("basic_arithmetic", "chain_sum")  # reasoning-gym generators of this task
OPERATORS = ("+", "-", "*", "/")

# Held-out problems come from seeds at and above this one; make_problems
# refuses training seeds that large, so the two never share a generator seed.
HELDOUT_SEED = 1_000_000_000

@dataclasses.dataclass(frozen=True, kw_only=True)
class Difficulty:
    """How hard the problems are. The defaults are the regime of DESIGN.md: 1-digit
    operands, 2-3 terms, + and -, where pass@8 >> pass@1 after ~150 s of supervision,
    which is where GRPO has signal."""

    min_terms: int = 2
    max_terms: int = 3
    min_digits: int = 1
    max_digits: int = 1
    operators: tuple[str, ...] = ("+", "-")

    def __post_init__(self):
        object.__setattr__(self, "operators", tuple(self.operators))
        if not 2 <= self.min_terms <= self.max_terms:
            raise UserError(f"arithmetic difficulty: need 2 <= min_terms <= max_terms, got {self.min_terms}..{self.max_terms}")
        if not 1 <= self.min_digits <= self.max_digits:
            raise UserError(f"arithmetic difficulty: need 1 <= min_digits <= max_digits, got {self.min_digits}..{self.max_digits}")
        if not self.operators or set(self.operators) - set(OPERATORS):
            raise UserError(f"arithmetic difficulty: operators must be a non-empty subset of + - * /, got {list(self.operators)}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Difficulty":
        """From a recipe's difficulty table, through the one config system (unknown keys refused)."""
        return config.build(cls, dict(d), "arithmetic difficulty")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


DEFAULT_DIFFICULTY = Difficulty()


@dataclasses.dataclass(frozen=True)
class Problem:
    prompt: str        # "3+4-2="
    answer: str        # "5"
    data_source: str   # the reasoning-gym task that made it


def target_text(answer: str) -> str:
    """What the model learns to write after the prompt (EOS is appended as a token)."""
    return f"#### {answer}"


def _gym_config(task: str, d: Difficulty) -> dict[str, Any] | None:
    """reasoning-gym's config for `task` at difficulty `d`, or None when the task cannot make it."""
    cfg: dict[str, Any] = {"min_terms": d.min_terms, "max_terms": d.max_terms, "min_digits": d.min_digits,
                           "max_digits": d.max_digits}
    if task == "basic_arithmetic":
        # No parentheses or unary minus: prompts stay in the chain_sum form "3+4-2=".
        cfg.update(operators=d.operators, allow_parentheses=False, allow_negation=False)
    elif task == "chain_sum" and set(d.operators) - {"+", "-"}:
        return None  # chain_sum only does + and -; other operators come from basic_arithmetic
    return cfg


def _generate(task: str, n: int, seed: int, cfg: dict[str, Any]) -> list[Problem]:
    # heavy: reasoning_gym imports every task family it ships (~1 s)
    import reasoning_gym

    ds = reasoning_gym.create_dataset(task, size=n, seed=seed, **cfg)
    return [Problem(f"{item['metadata']['expression'].replace(' ', '')}=", str(item["answer"]), task) for item in ds]


def _mix(n: int, seed: int, tasks: Sequence[str], difficulty: Difficulty) -> list[Problem]:
    tasks = tuple(tasks)
    if not tasks:
        raise UserError("arithmetic: tasks must name at least one of " + ", ".join(GYM_TASKS))
    bad = [t for t in tasks if t not in GYM_TASKS]
    if bad:
        raise UserError(f"unknown arithmetic task {bad[0]!r}; valid: {', '.join(GYM_TASKS)}")
    usable = [(t, cfg) for t in tasks if (cfg := _gym_config(t, difficulty)) is not None]
    if not usable:
        raise UserError("arithmetic: operators * or / need task basic_arithmetic")
    # Split n across tasks, each with its own seed derived from `seed`.
    per = [n // len(usable) + (1 if i < n % len(usable) else 0) for i in range(len(usable))]
    problems: list[Problem] = []
    for (task, cfg), k in zip(usable, per):
        if k:
            problems += _generate(task, k, seed * len(GYM_TASKS) + GYM_TASKS.index(task), cfg)
    random.Random(seed).shuffle(problems)
    return problems


def make_problems(n: int, seed: int, *, tasks: Sequence[str] = GYM_TASKS,
                  difficulty: Difficulty = DEFAULT_DIFFICULTY) -> list[Problem]:
    """`n` training problems for `seed`."""
    if n < 0:
        raise UserError(f"arithmetic: n must be >= 0, got {n}")
    if not 0 <= seed < HELDOUT_SEED:
        raise UserError(f"arithmetic: training seed must be in [0, {HELDOUT_SEED}), got {seed}")
    return _mix(n, seed, tasks, difficulty)


def heldout_problems(n: int, *, tasks: Sequence[str] = GYM_TASKS, exclude: Sequence[Problem] | None = None,
                     difficulty: Difficulty = DEFAULT_DIFFICULTY) -> list[Problem]:
    """`n` held-out problems from a seed training never uses.

    With `exclude` (training problems), prompts seen in training are dropped,
    so held-out accuracy measures generalisation rather than recall. Small
    problem spaces (1-digit, 2 terms) have few distinct prompts; the result
    may then hold fewer than `n` problems.
    """
    seen = {p.prompt for p in exclude or ()}
    out: list[Problem] = []
    batch = max(n, 64)
    for attempt in range(20):
        for p in _mix(batch, HELDOUT_SEED + attempt, tasks, difficulty):
            if p.prompt in seen:
                continue
            out.append(p)
            if len(out) == n:
                return out
    return out


def encode_example(tokenizer, problem: Problem) -> tuple[list[int], int]:
    """Token ids of BOS + prompt + target + EOS, and the prompt length (BOS included)."""
    return char_lm.encode_example(tokenizer, problem.prompt, target_text(problem.answer))


def lm_batch(tokenizer, problems: Sequence[Problem], seq_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, labels) right-padded; only `#### N` + EOS count (char_lm.lm_batch)."""
    return char_lm.lm_batch(tokenizer, [(p.prompt, target_text(p.answer)) for p in problems], seq_len)


def score(completion: str, answer: str) -> float:
    """1.0 when VeRL's gsm8k scorer (strict) finds the right `#### N`, else 0.0."""
    from verl.utils.reward_score import gsm8k  # heavy: verl imports ray and hydra pieces

    return float(gsm8k.compute_score(completion, answer, method="strict", format_score=0.0, score=1.0))


@dataclasses.dataclass(kw_only=True)
class ArithConfig(ModelConfig):
    """The `[arith]` table of an arith_lm recipe."""

    tasks: list[str] = dataclasses.field(default_factory=lambda: list(GYM_TASKS))  # reasoning-gym tasks
    n_train: int = 20000             # training problems (sampled with replacement per step)
    n_heldout: int = 1000            # held-out problems for eval.json (deduplicated against training)
    min_terms: int = 2               # fewest operands per problem
    max_terms: int = 3               # most operands per problem
    min_digits: int = 1              # fewest digits per operand
    max_digits: int = 1              # most digits per operand
    operators: list[str] = dataclasses.field(default_factory=lambda: ["+", "-"])  # subset of + - * /

    def difficulty(self) -> Difficulty:
        """The typed difficulty of make_problems (checked: bad values are a UserError)."""
        return Difficulty(min_terms=self.min_terms, max_terms=self.max_terms, min_digits=self.min_digits,
                          max_digits=self.max_digits, operators=tuple(self.operators))

    def check(self, section: str) -> None:
        if self.n_train < 1 or self.n_heldout < 1:
            raise UserError(f"{section}.n_train and {section}.n_heldout must be >= 1")
        super().check(section)
        self.difficulty()


@TASKS.register("arith_lm")
class ArithTask(CharLMTask):
    """Tiny Llama answering reasoning-gym arithmetic as `#### N`; the warm start of grpo_math."""

    section = "arith"
    Config = ArithConfig
    metric = "greedy exact match (verl gsm8k strict)"
    answer_slack = 2

    def problems(self):
        c = self.config
        train = make_problems(c.n_train, seed=self.seed, tasks=c.tasks, difficulty=c.difficulty())
        return train, heldout_problems(c.n_heldout, tasks=c.tasks, exclude=train, difficulty=c.difficulty())

    def target(self, problem: Problem) -> str:
        return target_text(problem.answer)

    def correct(self, completion: str, problem: Problem) -> float:
        return score(completion, problem.answer)

    def example(self, problem: Problem, completion: str) -> dict:
        return {"prompt": problem.prompt, "completion": completion, "answer": problem.answer}


# Word problems an rl recipe may mix in with the arithmetic generators (chat-message prompts).
OTHER_RL_TASKS = (gsm8k.SYMBOLIC,)


@dataclasses.dataclass(kw_only=True)
class ArithOptions:
    """`data.options` of an rl recipe on the arith source."""

    tasks: list[str] = dataclasses.field(default_factory=lambda: list(GYM_TASKS))  # mixed in equal shares


@TASK_SOURCES.register("arith")
class ArithSource(TaskSource):
    """reasoning-gym arithmetic (and gsm_symbolic) in the warm start's own prompt format."""

    Difficulty = Difficulty
    Options = ArithOptions

    def __init__(self, tasks: Sequence[str], difficulty: Difficulty, heldout_n: int):
        bad = [t for t in tasks if t not in GYM_TASKS + OTHER_RL_TASKS]
        if not tasks or bad:
            raise UserError(f"unknown rl data task {bad[0] if bad else '(none)'!r}; "
                            f"valid: {', '.join(GYM_TASKS + OTHER_RL_TASKS)} (or --data FILE.parquet)")
        self.tasks = tuple(tasks)
        self.difficulty = difficulty
        self.heldout_n = heldout_n
        self._heldout: list[Row] | None = None

    @classmethod
    def from_config(cls, data_cfg, seed: int) -> "ArithSource":
        return cls(cls.options(data_cfg).tasks, Difficulty.from_dict(data_cfg.difficulty), data_cfg.heldout_n)

    @classmethod
    def warm_start_overrides(cls, data_cfg) -> dict[str, Any]:
        ov: dict[str, Any] = {}
        tasks = [t for t in cls.options(data_cfg).tasks if t in GYM_TASKS]  # the warm start trains on arithmetic only
        if not data_cfg.file and tasks != list(GYM_TASKS):
            ov[f"{ArithTask.section}.tasks"] = tasks
        for k, v in data_cfg.difficulty.items():
            ov[f"{ArithTask.section}.{k}"] = list(v) if isinstance(v, (list, tuple)) else v
        return ov

    def _make(self, n: int, seed: int, heldout: bool) -> list[Row]:
        arith_tasks = [t for t in self.tasks if t in GYM_TASKS]
        other = [t for t in self.tasks if t not in GYM_TASKS]
        shares = _split(n, len(arith_tasks) > 0, len(other))
        out: list[Row] = []
        if arith_tasks and shares[0]:
            if heldout:
                rows = heldout_problems(shares[0], tasks=arith_tasks, difficulty=self.difficulty)
            else:
                rows = make_problems(shares[0], seed % HELDOUT_SEED, tasks=arith_tasks, difficulty=self.difficulty)
            out += _rows(rows)
        for _task, k in zip(other, shares[1:]):
            out += gsm8k.symbolic_problems(k, seed + (10**9 if heldout else 0))
        return out

    def heldout(self) -> list[Row]:
        if self._heldout is None:
            self._heldout = self._make(self.heldout_n, 0, heldout=True)
        return self._heldout

    def unseen(self, n: int, warm_start) -> list[Row]:
        """Held-out problems whose prompts the warm start never trained on either (arith_lm's
        own held-out definition: `exclude` = the warm start's training problems). In small
        problem spaces they are few distinct prompts, repeated."""
        if not isinstance(warm_start.settings, ArithConfig):
            return []
        tasks = [t for t in self.tasks if t in GYM_TASKS]
        seen = make_problems(warm_start.settings.n_train, warm_start.seed, tasks=tasks, difficulty=self.difficulty)
        return _rows(heldout_problems(n, tasks=tasks, exclude=seen, difficulty=self.difficulty))

    def fresh(self, n: int, seed: int) -> list[Row]:
        return self._make(n, seed, heldout=False)

    def train_batch(self, step: int, n: int, seed: int) -> list[Row]:
        banned = {p.prompt for p in self.heldout()}
        out: list[Row] = []
        attempt = 0
        while len(out) < n:
            for p in self._make(2 * n, stable_seed("train", seed, step, attempt), heldout=False):
                if p.prompt not in banned and len(out) < n:
                    out.append(p)
            attempt += 1
            if attempt > 50:
                raise UserError("rl data: almost every training prompt is a held-out prompt; "
                                "make the task harder or data.heldout_n smaller")
        return out

    def supervised_batches(self, tokenizer, batch_size: int, seed: int):
        """arith_lm's batches on the RL prompt stream (held-out prompts excluded), true answers."""
        def batch(step: int):
            rows = self.train_batch(step, batch_size, seed + 7919)
            return lm_batch(tokenizer, [Problem(p.prompt, p.ground_truth, p.data_source) for p in rows])

        return batch


def _rows(problems: Sequence[Problem]) -> list[Row]:
    return [Row(p.prompt, p.answer, p.data_source, "arithmetic") for p in problems]


def _split(n: int, has_arith: bool, n_other: int) -> list[int]:
    parts = int(has_arith) + n_other
    each = [n // parts + (1 if i < n % parts else 0) for i in range(parts)]
    return ([each[0]] + each[1:]) if has_arith else [0] + each
