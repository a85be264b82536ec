"""Training recipe schema: typed keyword-only dataclasses filled from TOML.

A recipe file (train/recipes/*.toml) names a `task` and holds the section of
that task plus the shared `[loop]` and `[optim]` sections. Every field is
documented in the shipped recipes; `tpu_pipeline.config.load` rejects
unknown keys and wrong types, and `validate` below rejects values that type
check but cannot work.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from tpu_pipeline.errors import UserError
from tpu_pipeline.train import countdown
from tpu_pipeline.train.arith import Difficulty


@dataclasses.dataclass(kw_only=True)
class LoopConfig:
    steps: int                       # optimizer steps of the whole run
    batch_size: int                  # global batch (split across --nproc processes)
    log_every: int = 10              # steps between metrics.jsonl / TensorBoard rows
    checkpoint_every: int = 0        # steps between checkpoints (0: only the last step)
    eval_every: int = 0              # steps between held-out evaluations (0: only at the end)
    compile: bool = False            # torch.compile the model (--compile/--no-compile override)
    bf16: bool = True                # bf16 autocast where the device has native bf16


@dataclasses.dataclass(kw_only=True)
class OptimConfig:
    lr: float                        # peak learning rate
    weight_decay: float = 0.0        # AdamW decoupled weight decay
    betas: list[float] = dataclasses.field(default_factory=lambda: [0.9, 0.999])  # AdamW betas
    eps: float = 1e-8                # AdamW epsilon
    warmup_steps: int = 0            # linear warm-up from 0 to lr
    min_lr_ratio: float = 0.1        # cosine decays to lr * min_lr_ratio at the last step
    grad_clip: float = 1.0           # max global gradient norm (0: no clipping)


@dataclasses.dataclass(kw_only=True)
class DigitsConfig:
    test_fraction: float = 0.2       # held-out share of sklearn's 1,797 digits
    split_seed: int = 0              # fixed train/test split (independent of the run seed)
    channels: list[int] = dataclasses.field(default_factory=lambda: [16, 32])  # conv widths
    hidden: int = 64                 # width of the hidden dense layer
    dropout: float = 0.1             # dropout before the classifier


@dataclasses.dataclass(kw_only=True)
class ArithConfig:
    tasks: list[str] = dataclasses.field(default_factory=lambda: ["basic_arithmetic", "chain_sum"])  # reasoning-gym tasks
    n_train: int = 20000             # training problems (sampled with replacement per step)
    n_heldout: int = 1000            # held-out problems for eval.json (deduplicated against training)
    min_terms: int = 2               # fewest operands per problem
    max_terms: int = 3               # most operands per problem
    min_digits: int = 1              # fewest digits per operand
    max_digits: int = 1              # most digits per operand
    operators: list[str] = dataclasses.field(default_factory=lambda: ["+", "-"])  # subset of + - * /
    hidden_size: int = 192           # Llama width
    intermediate_size: int = 512     # Llama MLP width
    num_hidden_layers: int = 4       # Llama depth
    num_attention_heads: int = 6     # attention heads
    num_key_value_heads: int = 6     # key/value heads (< heads: grouped-query attention)
    max_position_embeddings: int = 64  # longest prompt + answer in tokens
    pass_k: int = 8                  # eval.json also reports pass@k at temperature 1 (0: skip)
    n_pass_k: int = 200              # held-out problems used for pass@k

    def difficulty(self) -> Difficulty:
        """The typed difficulty of arith.make_problems (checked: bad values are a UserError)."""
        return Difficulty(min_terms=self.min_terms, max_terms=self.max_terms, min_digits=self.min_digits,
                          max_digits=self.max_digits, operators=tuple(self.operators))

    def model_config(self) -> dict:
        """LlamaConfig sizes (arith.llama_kwargs adds the tokenizer's ids)."""
        return {k: getattr(self, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                              "num_attention_heads", "num_key_value_heads",
                                              "max_position_embeddings")}


@dataclasses.dataclass(kw_only=True)
class CountdownConfig:
    n_train: int = 4000              # training problems, one solution each (sampled with replacement per step)
    n_heldout: int = 1000            # held-out problems for eval.json (deduplicated against training)
    min_numbers: int = 3             # fewest numbers per problem
    max_numbers: int = 3             # most numbers per problem
    min_value: int = 1               # smallest number
    max_value: int = 9               # largest number
    min_target: int = 1              # smallest target
    max_target: int = 30             # largest target
    operators: list[str] = dataclasses.field(default_factory=lambda: ["+", "-", "*", "/"])  # subset of + - * /
    hidden_size: int = 192           # Llama width
    intermediate_size: int = 512     # Llama MLP width
    num_hidden_layers: int = 4       # Llama depth
    num_attention_heads: int = 6     # attention heads
    num_key_value_heads: int = 6     # key/value heads
    max_position_embeddings: int = 64  # longest prompt + answer in tokens
    pass_k: int = 8                  # eval.json also reports pass@k at temperature 1 (0: skip)
    n_pass_k: int = 200              # held-out problems used for pass@k

    def difficulty(self) -> countdown.Difficulty:
        return countdown.Difficulty(**{k: getattr(self, k) for k in (
            "min_numbers", "max_numbers", "min_value", "max_value", "min_target", "max_target")},
            operators=tuple(self.operators))

    def model_config(self) -> dict:
        return ArithConfig.model_config(self)


@dataclasses.dataclass(kw_only=True)
class Recipe:
    description: str                 # one line shown by `tpu-pipeline recipes`
    task: Literal["digits_cnn", "arith_lm", "countdown_lm"]  # which model/data/eval the recipe trains
    seed: int = 0                    # run seed: init, batch order, dropout (--seed overrides)
    loop: LoopConfig
    optim: OptimConfig
    digits: DigitsConfig | None = None  # [digits] section, for task = "digits_cnn"
    arith: ArithConfig | None = None    # [arith] section, for task = "arith_lm"
    countdown: CountdownConfig | None = None  # [countdown] section, for task = "countdown_lm"
    expected_minutes_cpu: float = 0.0   # wall minutes of the default run on 2 CPU cores (tpu-pipeline recipes; 0: not measured)
    expected_minutes_gpu: float = 0.0   # the same on one GPU (0: not measured)


_TASK_SECTION = {"digits_cnn": "digits", "arith_lm": "arith", "countdown_lm": "countdown"}
_SECTION_DEFAULT = {"digits": DigitsConfig, "arith": ArithConfig, "countdown": CountdownConfig}


def validate(r: Recipe, where: str) -> Recipe:
    """Values that type check but cannot train; each a one-line UserError."""

    def bad(msg: str) -> None:
        raise UserError(f"{where}: {msg}")

    section = _TASK_SECTION[r.task]
    for task, other in _TASK_SECTION.items():
        if other != section and getattr(r, other) is not None:
            bad(f"section [{other}] belongs to task {task!r}, but task is {r.task!r}")
    if getattr(r, section) is None:
        setattr(r, section, _SECTION_DEFAULT[section]())
    L, O = r.loop, r.optim
    if L.steps < 1:
        bad(f"loop.steps must be >= 1, got {L.steps}")
    if L.batch_size < 1:
        bad(f"loop.batch_size must be >= 1, got {L.batch_size}")
    for k in ("log_every",):
        if getattr(L, k) < 1:
            bad(f"loop.{k} must be >= 1, got {getattr(L, k)}")
    for k in ("checkpoint_every", "eval_every"):
        if getattr(L, k) < 0:
            bad(f"loop.{k} must be >= 0, got {getattr(L, k)}")
    if not O.lr > 0:
        bad(f"optim.lr must be > 0, got {O.lr}")
    if O.weight_decay < 0:
        bad(f"optim.weight_decay must be >= 0, got {O.weight_decay}")
    if len(O.betas) != 2 or not all(0 <= b < 1 for b in O.betas):
        bad(f"optim.betas must be two numbers in [0, 1), got {O.betas}")
    if O.warmup_steps < 0:
        bad(f"optim.warmup_steps must be >= 0, got {O.warmup_steps}")
    if not 0 <= O.min_lr_ratio <= 1:
        bad(f"optim.min_lr_ratio must be in [0, 1], got {O.min_lr_ratio}")
    if O.grad_clip < 0:
        bad(f"optim.grad_clip must be >= 0, got {O.grad_clip}")
    if r.seed < 0:
        bad(f"seed must be >= 0, got {r.seed}")
    if r.digits is not None:
        d = r.digits
        if not 0 < d.test_fraction < 1:
            bad(f"digits.test_fraction must be in (0, 1), got {d.test_fraction}")
        if not d.channels or any(c < 1 for c in d.channels) or len(d.channels) > 3:
            bad(f"digits.channels must be 1-3 positive widths (8x8 input halves per conv), got {d.channels}")
        if d.hidden < 1:
            bad(f"digits.hidden must be >= 1, got {d.hidden}")
        if not 0 <= d.dropout < 1:
            bad(f"digits.dropout must be in [0, 1), got {d.dropout}")
    for name in ("arith", "countdown"):
        a = getattr(r, name)
        if a is None:
            continue
        if a.n_train < 1 or a.n_heldout < 1:
            bad(f"{name}.n_train and {name}.n_heldout must be >= 1")
        if a.hidden_size % a.num_attention_heads:
            bad(f"{name}.hidden_size ({a.hidden_size}) must be divisible by num_attention_heads ({a.num_attention_heads})")
        if a.num_attention_heads % a.num_key_value_heads:
            bad(f"{name}.num_attention_heads ({a.num_attention_heads}) must be divisible by num_key_value_heads ({a.num_key_value_heads})")
        if min(a.hidden_size, a.intermediate_size, a.num_hidden_layers) < 1:
            bad(f"{name} model sizes must be >= 1")
        if a.pass_k < 0 or a.n_pass_k < 0:
            bad(f"{name}.pass_k and {name}.n_pass_k must be >= 0")
        try:
            a.difficulty()
        except UserError as e:
            bad(str(e))
    return r

