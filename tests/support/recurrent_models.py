"""Sequence models with nn.LSTM / nn.GRU, trained a few steps so their gates are not at init.

Used by tests/convert/test_recurrent_on_cpu.py and bench/recurrent.py
(`from tpu_pipeline.testing import recurrent_models`).
"""

from __future__ import annotations

import torch
from torch import nn


class SequenceEncoder(nn.Module):
    """x [B, T, F] -> an embedding of the last layer's final hidden state (a speaker encoder's
    shape: GE2E's is 3 LSTM layers of 256 units over 40 mel features, then a projection and L2
    normalisation). batch_first=False feeds the recurrent layer [T, B, F], as such models do."""

    def __init__(self, features: int = 8, hidden: int = 16, layers: int = 2, *, cell: str = "lstm",
                 bidirectional: bool = False, batch_first: bool = True, out: int = 4, normalize: bool = False):
        super().__init__()
        rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[cell]
        self.batch_first, self.normalize = batch_first, normalize
        self.rnn = rnn(features, hidden, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first)
        self.proj = nn.Linear(hidden * (2 if bidirectional else 1), out)

    def forward(self, x):
        y, _ = self.rnn(x if self.batch_first else x.transpose(0, 1))
        last = (y[:, -1] if self.batch_first else y[-1])
        e = self.proj(last)
        return nn.functional.normalize(e, dim=-1) if self.normalize else e


def sequence_task(n: int, steps: int, features: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A synthetic task that needs memory: the class is which of 4 quarter-sequence windows held
    the largest summed first feature."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, steps, features, generator=g)
    windows = x[:, :, 0].reshape(n, 4, -1).sum(-1)
    return x, windows.argmax(-1)


def trained(model: SequenceEncoder, *, steps: int = 40, time_steps: int = 12, seed: int = 0) -> SequenceEncoder:
    """`model` after `steps` Adam steps on `sequence_task` (trained-like gates and hidden states), in eval mode."""
    torch.manual_seed(seed)
    features = model.rnn.input_size
    x, y = sequence_task(256, time_steps, features, seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for i in range(steps):
        idx = torch.arange(i * 32, i * 32 + 32) % len(x)
        logits = model(x[idx])[:, :4] if model.proj.out_features >= 4 else model(x[idx])
        loss = nn.functional.cross_entropy(logits, y[idx]) if model.proj.out_features >= 4 else logits.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()
