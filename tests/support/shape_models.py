"""Models whose inputs vary in shape, for shape buckets (convert/shapes.py): the tests and
bench/shape_buckets.py share them. Each says whether padding changes its output."""

from __future__ import annotations

import torch
from torch import nn


class MaskedTextCNN(nn.Module):
    """Text classifier over token ids with a mask input (1 = token, 0 = padding): padded
    embeddings are zeroed before the convolution and the mean counts real tokens only, so
    padding does not change the output (--pad ids=mask:mask)."""

    def __init__(self, vocab: int = 1000, dim: int = 32, width: int = 64, classes: int = 4):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.conv = nn.Conv1d(dim, width, 3, padding=1)
        self.fc = nn.Linear(width, classes)

    def forward(self, ids, mask):
        e = self.emb(ids) * mask.unsqueeze(-1)
        h = torch.relu(self.conv(e.transpose(1, 2))) * mask.unsqueeze(1)
        return self.fc(h.sum(-1) / mask.sum(-1, keepdim=True))

    def example_inputs(self, n: int = 32):
        return torch.zeros(1, n, dtype=torch.int64), torch.ones(1, n)


class MeanTextCNN(MaskedTextCNN):
    """The same classifier without the mask: its mean runs over padded positions too, so zero
    padding changes the output (the refusal's test case)."""

    def forward(self, ids):
        h = torch.relu(self.conv(self.emb(ids).transpose(1, 2)))
        return self.fc(h.mean(-1))

    def example_inputs(self, n: int = 32):
        return (torch.zeros(1, n, dtype=torch.int64),)


class GRUKeyword(nn.Module):
    """Keyword spotter over raw audio with a length input (samples): strided conv frames, a GRU,
    the class scores at the last frame inside the unpadded audio. The GRU runs forward in time,
    so frames after it (padding) do not change the output (--pad audio=length:length)."""

    def __init__(self, classes: int = 12, win: int = 640, hop: int = 320, hidden: int = 32):
        super().__init__()
        self.win, self.hop = win, hop
        self.conv = nn.Conv1d(1, 16, win, stride=hop)
        self.gru = nn.GRU(16, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, audio, length):
        h = torch.relu(self.conv(audio.unsqueeze(1))).transpose(1, 2)
        o, _ = self.gru(h)
        # the last frame inside the audio, chosen by integer compares and a select: an integer division
        # and a gather lower to ops TFLM lacks (FLOOR_DIV's SIGN/SELECT, REDUCE_ALL), and float compares
        # leave float32 tensors the full-integer iot variant refuses
        end = torch.arange(o.shape[1]) * self.hop + self.win
        n = length.reshape(-1, 1)
        last = (end <= n) & (end + self.hop > n)
        return self.fc(torch.where(last.unsqueeze(-1), o, torch.zeros_like(o)).sum(1))

    def example_inputs(self, n: int = 8000):
        return torch.zeros(1, n), torch.tensor([n])


class TwoResolutionCNN(nn.Module):
    """An image classifier whose global mean pool takes any resolution: buckets at two
    resolutions, rows of each bucket's exact shape (--pad x=none: zeros would change the mean)."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
                                      nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU())
        self.fc = nn.Linear(32, classes)

    def forward(self, x):
        return self.fc(self.features(x).mean((2, 3)))

    def example_inputs(self, size: tuple[int, int] = (32, 32)):
        return (torch.zeros(1, 3, *size),)
