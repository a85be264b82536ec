"""A small CNN for scikit-learn's 8x8 digits that takes raw pixels.

Normalization lives inside the model (two buffers set from the training
split), so an app feeds the data set's raw values: N x 1 x 8 x 8 float in
0..16. Only ops every LiteRT target has: conv, relu, max-pool, linear.
"""

from __future__ import annotations

import torch
from torch import nn


class DigitsCNN(nn.Module):
    def __init__(self, *, channels: list[int] = (16, 32), hidden: int = 64, dropout: float = 0.1,
                 num_classes: int = 10):
        super().__init__()
        layers: list[nn.Module] = []
        c_in, side = 1, 8
        for c in channels:
            layers += [nn.Conv2d(c_in, c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            c_in, side = c, side // 2
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(c_in * side * side, hidden), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )
        # Raw-pixel statistics of the training split; set by the trainer, saved in state_dict.
        self.register_buffer("pixel_mean", torch.zeros(()))
        self.register_buffer("pixel_std", torch.ones(()))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels: (N, 1, 8, 8) raw values 0..16 -> logits (N, 10)."""
        x = (pixels - self.pixel_mean) / self.pixel_std
        return self.head(self.features(x))
