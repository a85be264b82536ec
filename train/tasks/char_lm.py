"""The small character-level Llama that the text tasks (arith, countdown) train.

The tokenizer is character-level, built locally with the `tokenizers`
library, and the model is a small `LlamaForCausalLM` built from a config:
nothing comes from a hub. Supervision is next-token loss on the target
tokens only (the answer + EOS), prompts right-padded to one fixed length so
a compiled step sees one shape. `CharLMTask` is the train Task both share:
a task module supplies its problems, the target text and its verifier.

    from tpu_pipeline.train.tasks import char_lm
    tok = char_lm.build_tokenizer()
    model = char_lm.build_model()                       # ~1.8M parameters
    ids, labels = char_lm.lm_batch(tok, [("3+4-2=", "#### 5")])
"""

from __future__ import annotations

import abc
import dataclasses
import io
from pathlib import Path
from typing import Any, ClassVar, Sequence

import torch

from tpu_pipeline.errors import UserError
from tpu_pipeline.files import atomic_write_bytes, staged_dir
from tpu_pipeline.train.manifest import write_model
from tpu_pipeline.train.tasks.base import Task

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
        raise UserError(f"unknown char-LM model key {sorted(unknown)[0]!r}; valid: {', '.join(DEFAULT_MODEL)}")
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


def encode_example(tokenizer, prompt: str, target: str) -> tuple[list[int], int]:
    """Token ids of BOS + prompt + target + EOS, and the prompt length (BOS included)."""
    p = tokenizer(prompt)["input_ids"]
    t = tokenizer(target, add_special_tokens=False)["input_ids"]
    return p + t + [tokenizer.eos_token_id], len(p)


def lm_batch(tokenizer, examples: Sequence[tuple[str, str]], seq_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, labels) of (prompt, target) pairs, right-padded to `seq_len` (default: the
    longest example).

    The label at position t is the token at t+1, and only target tokens (+ EOS)
    count: prompt and padding positions hold IGNORE.
    """
    encoded = [encode_example(tokenizer, p, t) for p, t in examples]
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


@dataclasses.dataclass(kw_only=True)
class ModelConfig:
    """The char-LM fields of a text task's recipe section (its Config subclasses this)."""

    hidden_size: int = 192           # Llama width
    intermediate_size: int = 512     # Llama MLP width
    num_hidden_layers: int = 4       # Llama depth
    num_attention_heads: int = 6     # attention heads
    num_key_value_heads: int = 6     # key/value heads (< heads: grouped-query attention)
    max_position_embeddings: int = 64  # longest prompt + answer in tokens
    pass_k: int = 8                  # eval.json also reports pass@k at temperature 1 (0: skip)
    n_pass_k: int = 200              # held-out problems used for pass@k

    def model_config(self) -> dict:
        """LlamaConfig sizes (llama_kwargs adds the tokenizer's ids)."""
        return {k: getattr(self, k) for k in DEFAULT_MODEL}

    def check(self, section: str) -> None:
        """Values that type check but cannot train; a one-line UserError naming `section.key`."""
        if self.hidden_size % self.num_attention_heads:
            raise UserError(f"{section}.hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                            f"({self.num_attention_heads})")
        if self.num_attention_heads % self.num_key_value_heads:
            raise UserError(f"{section}.num_attention_heads ({self.num_attention_heads}) must be divisible by "
                            f"num_key_value_heads ({self.num_key_value_heads})")
        if min(self.hidden_size, self.intermediate_size, self.num_hidden_layers) < 1:
            raise UserError(f"{section} model sizes must be >= 1")
        if self.pass_k < 0 or self.n_pass_k < 0:
            raise UserError(f"{section}.pass_k and {section}.n_pass_k must be >= 0")


class CharLMTask(Task):
    """The char-level Llama on a text task; subclasses give the problems, target and verifier.

    Evaluation: greedy success on held-out problems, plus pass@k at temperature 1,
    which tells rl whether sampling finds answers greedy decoding misses. Writes
    model.pt, hf/ and optimizer.pt (rl carries the AdamW state into GRPO).
    """

    uses_kernels = True
    metric: ClassVar[str]            # what eval.json's accuracy is
    answer_slack: ClassVar[int]      # tokens generation may run past the longest known target

    def __init__(self, config, *, seed: int, recipe_name: str):
        super().__init__(config, seed=seed, recipe_name=recipe_name)
        self.tokenizer = build_tokenizer()
        self.train_problems, self.heldout = self.problems()
        # One fixed length (the longest example) so a compiled step sees one shape.
        self.ids, self.labels = lm_batch(self.tokenizer, [(p.prompt, self.target(p)) for p in self.train_problems])
        self.seq_len = self.ids.shape[1]
        if self.seq_len > config.max_position_embeddings:
            raise UserError(f"{self.section}: problems need {self.seq_len} tokens but max_position_embeddings is "
                            f"{config.max_position_embeddings}")
        self.num_train = len(self.train_problems)
        self.max_new_tokens = max(len(self.target(p)) for p in self.train_problems + self.heldout) + self.answer_slack

    @abc.abstractmethod
    def problems(self) -> tuple[list, list]:
        """(training problems, held-out problems); each has a `.prompt`."""

    @abc.abstractmethod
    def target(self, problem) -> str:
        """What supervision teaches the model to write after the prompt (EOS is appended)."""

    @abc.abstractmethod
    def correct(self, completion: str, problem) -> float:
        """1.0 when the task's verifier accepts `completion`, else 0.0."""

    @abc.abstractmethod
    def example(self, problem, completion: str) -> dict:
        """One row of eval.json's examples."""

    def model_kwargs(self) -> dict:
        return llama_kwargs(self.tokenizer, **self.config.model_config())

    def build_model(self):
        # heavy: transformers takes seconds to import; runner imports this module for digits runs too
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM(LlamaConfig(**self.model_kwargs()))

    def make_batch(self, idx):
        return {"input_ids": self.ids[idx], "labels": self.labels[idx]}

    def count(self, batch):
        return int((batch["labels"] != IGNORE).sum())

    def loss_sum(self, model, batch):
        return lm_loss_sum(model, batch["input_ids"], batch["labels"])

    @torch.no_grad()
    def generate(self, model, prompts: list[str], device, *, sample: bool = False, n: int = 1,
                 batch_size: int = 256) -> list[list[str]]:
        """Completions (decoded, special tokens dropped) for each prompt."""
        tok = self.tokenizer
        out: list[list[str]] = []
        was_training = model.training
        model.eval()
        for i in range(0, len(prompts), batch_size):
            enc = tok(prompts[i: i + batch_size], padding=True, return_tensors="pt").to(device)
            gen = model.generate(
                **enc, max_new_tokens=self.max_new_tokens, do_sample=sample, temperature=1.0 if sample else None,
                top_k=0 if sample else None, top_p=1.0 if sample else None, num_return_sequences=n,
                pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            texts = tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            out += [texts[j: j + n] for j in range(0, len(texts), n)]
        model.train(was_training)
        return out

    def evaluate(self, model, device) -> dict[str, Any]:
        c = self.config
        greedy = self.generate(model, [p.prompt for p in self.heldout], device)
        correct = [self.correct(g[0], p) for g, p in zip(greedy, self.heldout)]
        res: dict[str, Any] = {"accuracy": sum(correct) / len(correct), "n": len(correct), "metric": self.metric,
                               "examples": [self.example(p, g[0]) for p, g in list(zip(self.heldout, greedy))[:5]]}
        if c.pass_k and c.n_pass_k:
            probs = self.heldout[: c.n_pass_k]
            torch.manual_seed(self.seed)  # sampling in eval must not depend on the training RNG
            samples = self.generate(model, [p.prompt for p in probs], device, sample=True, n=c.pass_k,
                                    batch_size=max(1, 256 // c.pass_k))
            hits = [[self.correct(s, p) for s in ss] for ss, p in zip(samples, probs)]
            res[f"pass@{c.pass_k}"] = sum(max(h) for h in hits) / len(hits)
            res["sample_accuracy"] = sum(sum(h) / len(h) for h in hits) / len(hits)
            res["n_pass_k"] = len(probs)
        return res

    def export(self, model, out: Path, *, optimizer, metrics) -> None:
        ex = self.tokenizer(self.heldout[0].prompt, return_tensors="pt")["input_ids"]
        # Calibration rows: training prompts of the example's token length (one static shape).
        same = [p.prompt for p in self.train_problems if len(p.prompt) + 1 == ex.shape[1]][:64]
        calib = self.tokenizer(same, return_tensors="pt")["input_ids"] if same else ex
        write_model(
            out / "model.pt", model_class="tpu_pipeline.train.models.causal_lm:LlamaLM",
            model_kwargs=self.model_kwargs(), state_dict={f"lm.{k}": v for k, v in model.state_dict().items()},
            example_inputs=[ex], input_names=["input_ids"], output_names=["logits"], task="causal-lm",
            recipe=self.recipe_name, metrics=metrics, calibration_inputs=[calib])
        with staged_dir(out / "hf") as d:
            model.generation_config.pad_token_id = self.tokenizer.pad_token_id
            model.generation_config.eos_token_id = self.tokenizer.eos_token_id
            model.generation_config.bos_token_id = self.tokenizer.bos_token_id
            model.save_pretrained(d, safe_serialization=True)
            self.tokenizer.save_pretrained(d)
        # rl carries these AdamW moments into GRPO (DESIGN.md: a fresh Adam collapsed it).
        buf = io.BytesIO()
        torch.save({"param_names": [n for n, _ in model.named_parameters()],
                    "state_dict": optimizer.state_dict()}, buf)
        atomic_write_bytes(out / "optimizer.pt", buf.getvalue())

    def flops_per_sample(self, model) -> float:
        # 6 * (matmul parameters) * tokens, plus attention scores (QK^T and AV).
        c = model.config
        n_matmul = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n)
        n_matmul += c.vocab_size * c.hidden_size  # tied lm_head still does a matmul
        t = self.seq_len
        attn = 2 * 2 * c.num_hidden_layers * t * t * c.hidden_size / 2  # causal: half the scores
        return 3.0 * (2 * n_matmul * t + attn)
