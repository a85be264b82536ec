"""Export wrapper for the arith_lm Llama: forward(input_ids) -> logits.

A plain nn.Module holding a `LlamaForCausalLM` built from JSON-able config
keywords, so a `model.pt` manifest can rebuild it without pickled code; the
Hugging Face copy of the same weights lives in `DIR/hf/`.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM


class LlamaLM(nn.Module):
    def __init__(self, **config):
        super().__init__()
        self.lm = LlamaForCausalLM(LlamaConfig(**config))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids: (N, T) int64 -> logits (N, T, vocab)."""
        return self.lm(input_ids=input_ids, use_cache=False).logits
