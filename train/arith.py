"""Arithmetic task for arith_lm (and rl's grpo_math): problems, tokenizer, model.

Problems come from reasoning-gym's offline generators (`basic_arithmetic`,
`chain_sum`); each is rendered compactly as a prompt `"3+4-2="`, and the
model is trained to continue with `"#### 5"` then EOS: the form VeRL's
gsm8k scorer (strict) reads.

The tokenizer is character-level, built locally with the `tokenizers`
library, and the model is a small `LlamaForCausalLM` built from a config:
nothing comes from a hub.

    from tpu_pipeline.train import arith
    train = arith.make_problems(10_000, seed=0)
    test = arith.heldout_problems(1000)
    tok = arith.build_tokenizer()
    model = arith.build_model()
"""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import UserError

TASKS = ("basic_arithmetic", "chain_sum")

# Default regime (DESIGN.md): 1-digit operands, 2-3 terms, + and -. There
# pass@8 >> pass@1 after ~150 s of supervision, which is where GRPO has signal.
DEFAULT_DIFFICULTY: dict[str, Any] = {
    "min_terms": 2,
    "max_terms": 3,
    "min_digits": 1,
    "max_digits": 1,
    "operators": ("+", "-"),
}

# Held-out problems come from seeds at and above this one; make_problems
# refuses training seeds that large, so the two never share a generator seed.
HELDOUT_SEED = 1_000_000_000

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
# Every character a prompt or target can hold: digits, operators, parentheses,
# '=', '#', space, '.' (for division results).
CHARS = tuple("0123456789+-*/()=# .")

# Small Llama (~1.8M parameters): the warm-start size measured in DESIGN.md.
DEFAULT_MODEL: dict[str, Any] = {
    "hidden_size": 192,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 6,
    "num_key_value_heads": 6,
    "max_position_embeddings": 64,
}


def target_text(answer: str) -> str:
    """What the model learns to write after the prompt (EOS is appended as a token)."""
    return f"#### {answer}"


def _difficulty(task: str, difficulty: dict[str, Any]) -> dict[str, Any]:
    d = {**DEFAULT_DIFFICULTY, **difficulty}
    unknown = set(d) - set(DEFAULT_DIFFICULTY)
    if unknown:
        raise UserError(f"unknown arithmetic difficulty key {sorted(unknown)[0]!r}; "
                        f"valid: {', '.join(DEFAULT_DIFFICULTY)}")
    if not 2 <= d["min_terms"] <= d["max_terms"]:
        raise UserError(f"arithmetic difficulty: need 2 <= min_terms <= max_terms, got {d['min_terms']}..{d['max_terms']}")
    if not 1 <= d["min_digits"] <= d["max_digits"]:
        raise UserError(f"arithmetic difficulty: need 1 <= min_digits <= max_digits, got {d['min_digits']}..{d['max_digits']}")
    ops = tuple(d["operators"])
    if not ops or set(ops) - {"+", "-", "*", "/"}:
        raise UserError(f"arithmetic difficulty: operators must be a non-empty subset of + - * /, got {list(ops)}")
    cfg = {k: d[k] for k in ("min_terms", "max_terms", "min_digits", "max_digits")}
    if task == "basic_arithmetic":
        # No parentheses or unary minus: prompts stay in the chain_sum form "3+4-2=".
        cfg.update(operators=ops, allow_parentheses=False, allow_negation=False)
    elif task == "chain_sum":
        if set(ops) - {"+", "-"}:
            cfg["_skip"] = True  # chain_sum only does + and -; other operators come from basic_arithmetic
    return cfg


def _generate(task: str, n: int, seed: int, difficulty: dict[str, Any]) -> list[dict]:
    import reasoning_gym

    cfg = _difficulty(task, difficulty)
    cfg.pop("_skip", None)
    ds = reasoning_gym.create_dataset(task, size=n, seed=seed, **cfg)
    out = []
    for item in ds:
        expr = item["metadata"]["expression"].replace(" ", "")
        out.append({"prompt": f"{expr}=", "answer": str(item["answer"]), "data_source": task})
    return out


def _mix(n: int, seed: int, tasks: Sequence[str], difficulty: dict[str, Any]) -> list[dict]:
    import random

    tasks = tuple(tasks)
    if not tasks:
        raise UserError("arithmetic: tasks must name at least one of " + ", ".join(TASKS))
    bad = [t for t in tasks if t not in TASKS]
    if bad:
        raise UserError(f"unknown arithmetic task {bad[0]!r}; valid: {', '.join(TASKS)}")
    usable = [t for t in tasks if not _difficulty(t, difficulty).get("_skip")]
    if not usable:
        raise UserError("arithmetic: operators * or / need task basic_arithmetic")
    # Split n across tasks, each with its own seed derived from `seed`.
    per = [n // len(usable) + (1 if i < n % len(usable) else 0) for i in range(len(usable))]
    problems: list[dict] = []
    for i, (task, k) in enumerate(zip(usable, per)):
        if k:
            problems += _generate(task, k, seed * len(TASKS) + TASKS.index(task), difficulty)
    random.Random(seed).shuffle(problems)
    return problems


def make_problems(n: int, seed: int, *, tasks: Sequence[str] = TASKS, **difficulty) -> list[dict]:
    """`n` training problems `{"prompt", "answer", "data_source"}` for `seed`.

    difficulty: min_terms, max_terms, min_digits, max_digits, operators.
    """
    if n < 0:
        raise UserError(f"arithmetic: n must be >= 0, got {n}")
    if not 0 <= seed < HELDOUT_SEED:
        raise UserError(f"arithmetic: training seed must be in [0, {HELDOUT_SEED}), got {seed}")
    return _mix(n, seed, tasks, difficulty)


def heldout_problems(n: int, *, tasks: Sequence[str] = TASKS, exclude: Sequence[dict] | None = None,
                     **difficulty) -> list[dict]:
    """`n` held-out problems from a seed training never uses.

    With `exclude` (training problems), prompts seen in training are dropped,
    so held-out accuracy measures generalisation rather than recall. Small
    problem spaces (1-digit, 2 terms) have few distinct prompts; the result
    may then hold fewer than `n` problems.
    """
    seen = {p["prompt"] for p in exclude or ()}
    out: list[dict] = []
    prompts: set[str] = set()
    batch = max(n, 64)
    for attempt in range(20):
        for p in _mix(batch, HELDOUT_SEED + attempt, tasks, difficulty):
            if p["prompt"] in seen:
                continue
            out.append(p)
            prompts.add(p["prompt"])
            if len(out) == n:
                return out
    return out


def build_tokenizer():
    """Character-level `PreTrainedTokenizerFast`: one token per character.

    Encoding a prompt prepends BOS; EOS is appended by the caller after the
    target (generation stops on it).
    """
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
    from transformers import LlamaConfig

    return LlamaConfig(**llama_kwargs(tokenizer, **config))


def build_model(**config):
    """A small `LlamaForCausalLM` for the char tokenizer (defaults: DEFAULT_MODEL)."""
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM(llama_config(**config))


def encode_example(tokenizer, problem: dict) -> tuple[list[int], int]:
    """Token ids of BOS + prompt + target + EOS, and the prompt length (BOS included)."""
    prompt = tokenizer(problem["prompt"])["input_ids"]
    target = tokenizer(target_text(problem["answer"]), add_special_tokens=False)["input_ids"]
    return prompt + target + [tokenizer.eos_token_id], len(prompt)


def score(completion: str, answer: str) -> float:
    """1.0 when VeRL's gsm8k scorer (strict) finds the right `#### N`, else 0.0."""
    from verl.utils.reward_score import gsm8k

    return float(gsm8k.compute_score(completion, answer, method="strict", format_score=0.0, score=1.0))
