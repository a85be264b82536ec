"""Tiny chat policies for the rl tests, built offline: a character-level tokenizer with
Qwen's chat markup (<|im_start|>, <|im_end|>) and a chat template, and a random
Llama causal LM over it, saved as a Hugging Face folder.

Llama, not Qwen2: transformers 5 loads any tokenizer beside a qwen2 config as its
byte-level Qwen2Tokenizer, which drops this character tokenizer's whitespace."""

from __future__ import annotations

import string
from pathlib import Path

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]


def chat_tokenizer(chat_template: str | None = CHAT_TEMPLATE):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set(string.printable) | {"×", "÷", "•", "€", "£"})
    vocab = {t: i for i, t in enumerate(SPECIALS + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token="<unk>", additional_special_tokens=["<|im_start|>"],
                                   padding_side="left", model_max_length=4096)
    if chat_template:
        fast.chat_template = chat_template
    return fast


def save_chat_policy(out: Path, *, family: str = "llama", chat_template: str | None = CHAT_TEMPLATE,
                     seed: int = 0) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    tok = chat_tokenizer(chat_template)
    cls = {"qwen2": Qwen2Config, "llama": LlamaConfig}[family]
    config = cls(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                 tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                 bos_token_id=None)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
