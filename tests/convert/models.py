"""Models that exist to make convert fail in a known way. The tests hand them
to the CLI by class path (`--model-class tests.convert.models:Unconvertible`),
as a user hands over their own class."""

from __future__ import annotations

import torch
from torch import nn

from tpu_pipeline.convert.reference_models import DepthwiseCNN

MODULE = "tests.convert.models"


class _ExportOnlyScale(nn.Module):
    """Scales its input only while torch.export traces: eager and exported graphs differ here."""

    def forward(self, x):
        if torch.compiler.is_exporting():
            return x * 1.5 + 0.25
        return x


class PlantedMismatchCNN(DepthwiseCNN):
    """A DepthwiseCNN whose `blocks.3` (a pointwise conv) converts to something else than
    PyTorch runs: the parity check must fail and name that layer."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.blocks[3] = nn.Sequential(self.blocks[3], _ExportOnlyScale())


class Unconvertible(nn.Module):
    """Uses an op with a data-dependent output shape, which LiteRT cannot express."""

    def __init__(self, size: int = 8):
        super().__init__()
        self.size = size
        self.fc = nn.Linear(size, size)

    def forward(self, x):
        return torch.nonzero(self.fc(x) > 0).float().sum(dim=0, keepdim=True)

    def example_inputs(self):
        return (torch.randn(1, self.size),)
