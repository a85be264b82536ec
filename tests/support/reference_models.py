"""Small reference models for trying `convert` without the train stage: the
benchmark (bench/convert.py, docs/BENCHMARKS.md) and the tests build them,
and a model.pt manifest may name them as
`tpu_pipeline.testing.reference_models:DepthwiseCNN` (or TinyEncoder,
TinyDecoderLM). Models that exist only to make a test fail live in
convert_models.py beside this file.

Each takes only JSON-able constructor kwargs (the model.pt manifest stores
them) and has `example_inputs()` giving batch-1 sample arguments.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class DepthwiseCNN(nn.Module):
    """MobileNet-style: stem conv, depthwise-separable blocks, global pool, classifier."""

    def __init__(self, in_channels: int = 1, size: int = 8, width: int = 16, blocks: int = 2, classes: int = 10):
        super().__init__()
        self.in_channels, self.size = in_channels, size
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU6())
        layers = []
        for _ in range(blocks):
            layers += [nn.Conv2d(width, width, 3, padding=1, groups=width), nn.BatchNorm2d(width), nn.ReLU6(),
                       nn.Conv2d(width, width, 1), nn.BatchNorm2d(width), nn.ReLU6()]
        self.blocks = nn.Sequential(*layers)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.head(x.mean(dim=(2, 3)))

    def example_inputs(self):
        return (torch.randn(1, self.in_channels, self.size, self.size),)


class TinyEncoder(nn.Module):
    """Transformer encoder over int64 token ids -> class logits (exercises int64 -> int32)."""

    def __init__(self, vocab: int = 64, seq: int = 16, dim: int = 32, heads: int = 2, layers: int = 2, classes: int = 4):
        super().__init__()
        self.vocab, self.seq = vocab, seq
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, seq, dim) * 0.02)
        self.layers = nn.ModuleList(EncoderBlock(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, input_ids):
        x = self.embed(input_ids) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x).mean(dim=1))

    def example_inputs(self):
        return (torch.randint(0, self.vocab, (1, self.seq), dtype=torch.int64),)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, causal: bool = False):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(x).reshape(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(d // h)
        if self.causal:
            mask = torch.ones(t, t, dtype=torch.bool).tril()
            att = att.masked_fill(~mask, -1e9)  # finite: -inf breaks int8 calibration ranges
        y = att.softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class EncoderBlock(nn.Module):
    def __init__(self, dim: int, heads: int, causal: bool = False):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, causal)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyDecoderLM(nn.Module):
    """GPT-style causal decoder: int64 token ids -> next-token logits for every position."""

    def __init__(self, vocab: int = 64, seq: int = 16, dim: int = 32, heads: int = 2, layers: int = 2):
        super().__init__()
        self.vocab, self.seq = vocab, seq
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, seq, dim) * 0.02)
        self.layers = nn.ModuleList(EncoderBlock(dim, heads, causal=True) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids):
        x = self.embed(input_ids) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))

    def example_inputs(self):
        return (torch.randint(0, self.vocab, (1, self.seq), dtype=torch.int64),)
