"""Tiny random Hugging Face causal LMs, one per family, saved as HF folders with
the project's offline character tokenizer (train/arith.py). Nothing downloaded.

Used by tests/convert/test_litertlm_on_cpu.py, tests/convert/test_lm_families_on_cpu.py,
bench/lm_families.py and bench/lm_recipes.py (`from tpu_pipeline.testing import lm_zoo`). initializer_range 0.2 (HF's default is 0.02) gives
random weights decisive logits, so greedy text is not a chain of near-ties.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from tpu_pipeline.train.tasks.char_lm import build_model, build_tokenizer

# The parity prompts the bench and tests use (characters of the char tokenizer).
PROMPTS = ("1+2=", "34-7+5=", "(9*8)/3=", "12 # 4 = 0.5", "7")

_LLAMA_LIKE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.2)

# name -> (config class, model class, config keywords on top of the llama-like shape)
FAMILIES: dict[str, tuple[str, str, dict]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "smollm": ("LlamaConfig", "LlamaForCausalLM", {"tie_word_embeddings": True, "num_key_value_heads": 1}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    "mistral_sliding": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 8}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 16, "num_key_value_heads": 1}),
    # Untied head: with Gemma's scaled embeddings a tied random head repeats the input token
    # forever, greedy text that no sliding window (or its absence) can change.
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 16, "sliding_window": 8,
                                                     "tie_word_embeddings": False}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 16, "sliding_window": 8,
                                                         "tie_word_embeddings": False}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", None),  # its own keyword names, below
}


def save_family(name: str, out: Path, *, kv_heads: int | None = None, seed: int = 0) -> Path:
    """Writes a tiny random `name` model (FAMILIES) with the char tokenizer to `out`; returns `out`.
    kv_heads overrides num_key_value_heads (1: multi-query, 2: grouped, 4: full)."""
    config_cls, model_cls, extra = FAMILIES[name]
    tok = build_tokenizer()
    ids = dict(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    if extra is None:
        kwargs = dict(n_embd=64, n_layer=2, n_head=4, n_positions=128, initializer_range=0.2, **ids)
    else:
        kwargs = {**_LLAMA_LIKE, **extra, **ids, "pad_token_id": tok.pad_token_id}
        if kv_heads is not None:
            kwargs["num_key_value_heads"] = kv_heads
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**kwargs)).eval()
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def save_grpo_policy_shape(out: Path, *, seed: int = 0) -> Path:
    """The default grpo_math policy's architecture (train/arith.py DEFAULT_MODEL: Llama, 4 layers,
    hidden 192, 6 heads, tied embeddings) with random weights: what decode speed is measured on."""
    tok = build_tokenizer()
    torch.manual_seed(seed)
    model = build_model().eval()
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
