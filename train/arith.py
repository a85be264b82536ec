"""Arithmetic task for arith_lm (and rl's grpo_math): problems, tokenizer, model.

Problems come from reasoning-gym's offline generators (`basic_arithmetic`,
`chain_sum`); each is rendered compactly as a prompt `"3+4-2="`, and the
model is trained to continue with `"#### 5"` then EOS: the form VeRL's
gsm8k scorer (strict) reads.

The tokenizer is character-level, built locally with the `tokenizers`
library, and the model is a small `LlamaForCausalLM` built from a config:
nothing comes from a hub.

    from tpu_pipeline.train import arith
    d = arith.Difficulty(max_terms=4)                  # typed; the default is DEFAULT_DIFFICULTY
    train = arith.make_problems(10_000, seed=0, difficulty=d)   # [Problem(prompt, answer, data_source)]
    test = arith.heldout_problems(1000, difficulty=d, exclude=train)
    tok = arith.build_tokenizer()
    model = arith.build_model()
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Mapping, Sequence

import torch

from tpu_pipeline import config
from tpu_pipeline.errors import UserError

TASKS = ("basic_arithmetic", "chain_sum")
OPERATORS = ("+", "-", "*", "/")

# Held-out problems come from seeds at and above this one; make_problems
# refuses training seeds that large, so the two never share a generator seed.
HELDOUT_SEED = 1_000_000_000

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
# Every character a prompt or target can hold: digits, operators, parentheses,
# '=', '#', space, '.' (for division results).
CHARS = tuple("0123456789+-*/()=# .")
IGNORE = -100  # label of positions that do not count in the loss (prompt, padding)

# Small Llama (~1.8M parameters): the warm-start size measured in DESIGN.md.
DEFAULT_MODEL: dict[str, Any] = {
    "hidden_size": 192,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 6,
    "num_key_value_heads": 6,
    "max_position_embeddings": 64,
}


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
        raise UserError("arithmetic: tasks must name at least one of " + ", ".join(TASKS))
    bad = [t for t in tasks if t not in TASKS]
    if bad:
        raise UserError(f"unknown arithmetic task {bad[0]!r}; valid: {', '.join(TASKS)}")
    usable = [(t, cfg) for t in tasks if (cfg := _gym_config(t, difficulty)) is not None]
    if not usable:
        raise UserError("arithmetic: operators * or / need task basic_arithmetic")
    # Split n across tasks, each with its own seed derived from `seed`.
    per = [n // len(usable) + (1 if i < n % len(usable) else 0) for i in range(len(usable))]
    problems: list[Problem] = []
    for (task, cfg), k in zip(usable, per):
        if k:
            problems += _generate(task, k, seed * len(TASKS) + TASKS.index(task), cfg)
    random.Random(seed).shuffle(problems)
    return problems


def make_problems(n: int, seed: int, *, tasks: Sequence[str] = TASKS,
                  difficulty: Difficulty = DEFAULT_DIFFICULTY) -> list[Problem]:
    """`n` training problems for `seed`."""
    if n < 0:
        raise UserError(f"arithmetic: n must be >= 0, got {n}")
    if not 0 <= seed < HELDOUT_SEED:
        raise UserError(f"arithmetic: training seed must be in [0, {HELDOUT_SEED}), got {seed}")
    return _mix(n, seed, tasks, difficulty)


def heldout_problems(n: int, *, tasks: Sequence[str] = TASKS, exclude: Sequence[Problem] | None = None,
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


def build_tokenizer():
    """Character-level `PreTrainedTokenizerFast`: one token per character.

    Encoding a prompt prepends BOS; EOS is appended by the caller after the
    target (generation stops on it).
    """
    # heavy: transformers takes seconds to import (it pulls in torchao); digits runs never need it
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
        padding_side="left", model_max_length=DEFAULT_MODEL["max_position_embeddings"])


def llama_kwargs(tokenizer=None, **config) -> dict:
    """JSON-able LlamaConfig keywords for the char tokenizer (what model.pt stores)."""
    tokenizer = tokenizer or build_tokenizer()
    unknown = set(config) - set(DEFAULT_MODEL)
    if unknown:
        raise UserError(f"unknown arith model key {sorted(unknown)[0]!r}; valid: {', '.join(DEFAULT_MODEL)}")
    return {**DEFAULT_MODEL, **config, "vocab_size": len(tokenizer), "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id,
            "tie_word_embeddings": True}


def llama_config(tokenizer=None, **config):
    from transformers import LlamaConfig  # heavy: see build_tokenizer

    return LlamaConfig(**llama_kwargs(tokenizer, **config))


def build_model(**config):
    """A small `LlamaForCausalLM` for the char tokenizer (defaults: DEFAULT_MODEL)."""
    from transformers import LlamaForCausalLM  # heavy: see build_tokenizer

    return LlamaForCausalLM(llama_config(**config))


def encode_example(tokenizer, problem: Problem) -> tuple[list[int], int]:
    """Token ids of BOS + prompt + target + EOS, and the prompt length (BOS included)."""
    prompt = tokenizer(problem.prompt)["input_ids"]
    target = tokenizer(target_text(problem.answer), add_special_tokens=False)["input_ids"]
    return prompt + target + [tokenizer.eos_token_id], len(prompt)


def lm_batch(tokenizer, problems: Sequence[Problem], seq_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, labels), right-padded to `seq_len` (default: the longest example).

    The label at position t is the token at t+1, and only target tokens
    (`#### N` + EOS) count: prompt and padding positions hold IGNORE.
    """
    encoded = [encode_example(tokenizer, p) for p in problems]
    L = seq_len or max(len(ids) for ids, _ in encoded)
    ids = torch.full((len(encoded), L), tokenizer.pad_token_id, dtype=torch.int64)
    labels = torch.full((len(encoded), L), IGNORE, dtype=torch.int64)
    for i, (x, n_prompt) in enumerate(encoded):
        ids[i, : len(x)] = torch.tensor(x)
        labels[i, n_prompt - 1: len(x) - 1] = torch.tensor(x[n_prompt:])
    return ids, labels


def lm_loss_sum(model: torch.nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed next-token cross-entropy over the target tokens of an `lm_batch`.

    Right padding comes after the last target token: real tokens never attend
    to pads under the causal mask, so no attention mask is needed.
    """
    logits = model(input_ids=input_ids, use_cache=False).logits
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE,
                                             reduction="sum")


def score(completion: str, answer: str) -> float:
    """1.0 when VeRL's gsm8k scorer (strict) finds the right `#### N`, else 0.0."""
    from verl.utils.reward_score import gsm8k  # heavy: verl imports ray and hydra pieces

    return float(gsm8k.compute_score(completion, answer, method="strict", format_score=0.0, score=1.0))
