"""Prompts with verifiable answers, in VeRL's row schema.

Every source yields rows shaped like VeRL's parquet data (data_source, prompt,
ability, reward_model.ground_truth, extra_info), so the local engine and
`--engine verl` read the same thing:

- ArithSource: reasoning-gym tasks through `tpu_pipeline.train.arith` (the
  warm start's own task and format), a fixed held-out split (arith's held-out
  seed), and training batches that never contain a held-out prompt;
  `gsm_symbolic` comes straight from reasoning-gym (word problems: for a real
  model on bigger hardware, not the char-level warm start).
- ParquetSource: a file made by VeRL's preprocessing scripts (GSM8K, MATH...),
  validated row by row; a fixed held-out split by seeded permutation.
"""

from __future__ import annotations

import hashlib
import io
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from tpu_pipeline.errors import UserError
from tpu_pipeline.files import atomic_write_bytes
from tpu_pipeline.train import arith

ARITH_TASKS = arith.TASKS
OTHER_TASKS = ("gsm_symbolic",)
GSM_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


@dataclass
class Problem:
    prompt: Any                 # str, or a list of chat messages [{"role", "content"}]
    ground_truth: str
    data_source: str
    ability: str = "math"
    extra_info: dict = field(default_factory=dict)

    def prompt_text(self, tokenizer=None) -> str:
        """The text the policy continues: raw for plain prompts; the chat template where the
        tokenizer has one; else the messages' contents joined (char-level tokenizers)."""
        if isinstance(self.prompt, str):
            return self.prompt
        if tokenizer is not None and getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(self.prompt, add_generation_prompt=True, tokenize=False)
        return "\n".join(m["content"] for m in self.prompt)

    def to_row(self, index: int, split: str) -> dict:
        prompt = self.prompt if isinstance(self.prompt, list) else [{"role": "user", "content": self.prompt}]
        return {
            "data_source": self.data_source,
            "prompt": prompt,
            "ability": self.ability,
            "reward_model": {"style": "rule", "ground_truth": self.ground_truth},
            "extra_info": {"split": split, "index": index, **self.extra_info},
        }


def _seed(*parts: Any) -> int:
    """A stable 31-bit seed from parts (Python's hash() is salted per process)."""
    h = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


def _from_arith(rows: Sequence[arith.Problem]) -> list[Problem]:
    return [Problem(r.prompt, r.answer, r.data_source, "arithmetic") for r in rows]


class ArithSource:
    def __init__(self, tasks: Sequence[str], difficulty: arith.Difficulty, heldout_n: int):
        bad = [t for t in tasks if t not in ARITH_TASKS + OTHER_TASKS]
        if not tasks or bad:
            raise UserError(f"unknown rl data task {bad[0] if bad else '(none)'!r}; "
                            f"valid: {', '.join(ARITH_TASKS + OTHER_TASKS)} (or --data FILE.parquet)")
        self.tasks = tuple(tasks)
        self.difficulty = difficulty
        self.heldout_n = heldout_n
        self._heldout: list[Problem] | None = None

    def _make(self, n: int, seed: int, heldout: bool) -> list[Problem]:
        arith_tasks = [t for t in self.tasks if t in ARITH_TASKS]
        other = [t for t in self.tasks if t not in ARITH_TASKS]
        shares = _split(n, len(arith_tasks) > 0, len(other))
        out: list[Problem] = []
        if arith_tasks and shares[0]:
            if heldout:
                rows = arith.heldout_problems(shares[0], tasks=arith_tasks, difficulty=self.difficulty)
            else:
                rows = arith.make_problems(shares[0], seed % arith.HELDOUT_SEED, tasks=arith_tasks,
                                           difficulty=self.difficulty)
            out += _from_arith(rows)
        for task, k in zip(other, shares[1:]):
            out += _gym(task, k, seed + (10**9 if heldout else 0))
        return out

    def heldout(self) -> list[Problem]:
        if self._heldout is None:
            self._heldout = self._make(self.heldout_n, 0, heldout=True)
        return self._heldout

    def unseen(self, n: int, train_problems: int, train_seed: int) -> list[Problem]:
        """Held-out problems whose prompts the warm start never trained on either (arith's
        own held-out definition: `exclude` = the warm start's training problems). In small
        problem spaces they are few distinct prompts, repeated."""
        tasks = [t for t in self.tasks if t in ARITH_TASKS]
        seen = arith.make_problems(train_problems, train_seed, tasks=tasks, difficulty=self.difficulty)
        rows = arith.heldout_problems(n, tasks=tasks, exclude=seen, difficulty=self.difficulty)
        return _from_arith(rows)

    def fresh(self, n: int, seed: int) -> list[Problem]:
        """Problems from a generator seed of the caller's choice (for `eval --seed`)."""
        return self._make(n, seed, heldout=False)

    def train_batch(self, step: int, n: int, seed: int) -> list[Problem]:
        """`n` training prompts for `step`, none of them a held-out prompt."""
        banned = {p.prompt for p in self.heldout()}
        out: list[Problem] = []
        attempt = 0
        while len(out) < n:
            for p in self._make(2 * n, _seed("train", seed, step, attempt), heldout=False):
                if p.prompt not in banned and len(out) < n:
                    out.append(p)
            attempt += 1
            if attempt > 50:
                raise UserError("rl data: almost every training prompt is a held-out prompt; "
                                "make the task harder or data.heldout_n smaller")
        return out


def _split(n: int, has_arith: bool, n_other: int) -> list[int]:
    parts = int(has_arith) + n_other
    each = [n // parts + (1 if i < n % parts else 0) for i in range(parts)]
    return ([each[0]] + each[1:]) if has_arith else [0] + each


def _gym(task: str, n: int, seed: int) -> list[Problem]:
    # heavy: reasoning_gym imports every task family it ships (~1 s)
    import reasoning_gym

    if n <= 0:
        return []
    ds = reasoning_gym.create_dataset(task, size=n, seed=seed)
    return [Problem([{"role": "user", "content": f"{x['question']} {GSM_INSTRUCTION}"}], str(x["answer"]), task)
            for x in ds]


class ParquetSource:
    """Rows of a VeRL parquet file; the last `heldout_n` of a seeded permutation are held out."""

    def __init__(self, path: str | Path, heldout_n: int, seed: int = 0):
        self.path = Path(path)
        self.problems = read_parquet(self.path)
        order = list(range(len(self.problems)))
        random.Random(_seed("split", seed)).shuffle(order)
        k = min(heldout_n, len(order) // 10) if len(order) >= 10 else 0
        self._heldout = [self.problems[i] for i in order[len(order) - k:]] if k else []
        self._train = [self.problems[i] for i in order[: len(order) - k]]
        if not self._train:
            raise UserError(f"{self.path}: no training rows")

    def heldout(self) -> list[Problem]:
        if not self._heldout:
            raise UserError(f"{self.path}: too few rows for a held-out split (need >= 10)")
        return self._heldout

    def fresh(self, n: int, seed: int) -> list[Problem]:
        rng = random.Random(_seed("fresh", seed))
        return rng.sample(self.problems, min(n, len(self.problems)))

    def train_batch(self, step: int, n: int, seed: int) -> list[Problem]:
        # Epochs over a seeded permutation: the batch of a step depends only on (seed, step).
        per_epoch = max(1, len(self._train) // n)
        epoch, pos = divmod(step, per_epoch)
        order = list(range(len(self._train)))
        random.Random(_seed("epoch", seed, epoch)).shuffle(order)
        idx = [order[(pos * n + i) % len(order)] for i in range(n)]
        return [self._train[i] for i in idx]


def read_parquet(path: str | Path) -> list[Problem]:
    """Rows in VeRL's schema -> Problems; a malformed row fails with its row number."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--data {path}: file not found")
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow raises several types for a non-parquet file
        raise UserError(f"--data {path}: not a readable parquet file ({type(e).__name__}: {e})") from None
    if not rows:
        raise UserError(f"--data {path}: no rows")
    return [_row(path, i, r) for i, r in enumerate(rows)]


def _row(path: Path, i: int, r: dict) -> Problem:
    where = f"{path}: row {i}"
    ds = r.get("data_source")
    if not isinstance(ds, str) or not ds:
        raise UserError(f"{where}: 'data_source' must be a non-empty string, got {ds!r}")
    prompt = r.get("prompt")
    if isinstance(prompt, str):
        if not prompt:
            raise UserError(f"{where}: 'prompt' is empty")
    elif isinstance(prompt, (list, tuple)) and prompt:
        for j, m in enumerate(prompt):
            if not isinstance(m, dict) or not isinstance(m.get("content"), str) or not isinstance(m.get("role"), str):
                raise UserError(f"{where}: prompt[{j}] must be {{'role': str, 'content': str}}, got {m!r}")
        prompt = [{"role": m["role"], "content": m["content"]} for m in prompt]
    else:
        raise UserError(f"{where}: 'prompt' must be a list of chat messages or a string, got {prompt!r}")
    rm = r.get("reward_model")
    gt = rm.get("ground_truth") if isinstance(rm, dict) else None
    if gt is None or (isinstance(gt, str) and not gt):
        raise UserError(f"{where}: 'reward_model.ground_truth' is missing")
    extra = r.get("extra_info") if isinstance(r.get("extra_info"), dict) else {}
    return Problem(prompt, gt if isinstance(gt, str) else str(gt), ds, str(r.get("ability") or "math"), dict(extra))


def write_parquet(problems: Sequence[Problem], path: str | Path, split: str) -> Path:
    """Problems -> a parquet file VeRL's RLHFDataset reads (written atomically)."""
    table = pa.Table.from_pylist([p.to_row(i, split) for i, p in enumerate(problems)])
    buf = io.BytesIO()
    pq.write_table(table, buf)
    atomic_write_bytes(path, buf.getvalue())
    return Path(path)


# Parquet files shipped inside the package (grpo_gsm8k's offline problems): a recipe or
# --data names one by its bare file name.
DATASETS = Path(__file__).parent / "datasets"


def resolve_data_file(file: str | Path) -> Path:
    """`file` as given when it exists; else, for a bare file name, the shipped dataset of that name."""
    path = Path(file)
    if not path.exists() and path.name == str(file) and (DATASETS / path.name).is_file():
        return DATASETS / path.name
    return path


# Sources of tasks outside arithmetic, by task name: factory(data_cfg, seed). Their modules
# register themselves (tpu_pipeline.rl.countdown; rl/api.py imports them).
TASK_SOURCES: dict[str, Any] = {}


def build_source(data_cfg, seed: int, file: str = ""):
    file = file or data_cfg.file
    if not file and any(t in TASK_SOURCES for t in data_cfg.tasks):
        return TASK_SOURCES[next(t for t in data_cfg.tasks if t in TASK_SOURCES)](data_cfg, seed)
    if file:
        return ParquetSource(resolve_data_file(file), data_cfg.heldout_n, seed)
    return ArithSource(data_cfg.tasks, data_cfg.arith_difficulty(), data_cfg.heldout_n)
