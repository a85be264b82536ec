"""Models that exist to make convert fail in a known way. The tests hand them
to the CLI by class path
(`--model-class tpu_pipeline.testing.convert_models:Unconvertible`), as a user
hands over their own class."""

from __future__ import annotations

import torch
from torch import nn

from tpu_pipeline.testing.reference_models import DepthwiseCNN

MODULE = "tpu_pipeline.testing.convert_models"


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


class TextCNN(nn.Module):
    """Token ids (int64) -> nn.Embedding -> Conv1d -> ReLU -> mean (or max: pool="max") over time
    -> Linear: the text classifier the iot target must take full-integer (embedding as int8 GATHER,
    max over time as int8 REDUCE_MAX: convert/precision/tflm_int8.py)."""

    def __init__(self, vocab: int = 2000, dim: int = 48, seq: int = 32, channels: int = 64, classes: int = 5,
                 pool: str = "mean"):
        super().__init__()
        self.vocab, self.seq, self.pool = vocab, seq, pool
        self.embed = nn.Embedding(vocab, dim)  # rows N(0, 1): what a trained table's scale looks like
        self.conv = nn.Conv1d(dim, channels, 3, padding=1)
        self.head = nn.Linear(channels, classes)

    def forward(self, ids):
        x = torch.relu(self.conv(self.embed(ids).transpose(1, 2)))
        return self.head(x.amax(dim=2) if self.pool == "max" else x.mean(dim=2))

    def example_inputs(self):
        return (torch.randint(0, self.vocab, (1, self.seq), dtype=torch.int64),)


class McuBlock(nn.Module):
    """A keyword-spotting-like block using every MCU op (issue 21): Conv1d features, LayerNorm,
    GELU, an RMS (SQRT of a mean square), max over time, a Linear head."""

    def __init__(self, ch: int = 32, classes: int = 6):
        super().__init__()
        self.conv = nn.Conv1d(10, ch, 3, padding=1)
        self.norm = nn.LayerNorm(ch)
        self.act = nn.GELU()
        self.head = nn.Linear(ch + 1, classes)

    def forward(self, x):                                            # x: N x 10 coefficients x 49 frames
        h = self.act(self.norm(self.conv(x).transpose(1, 2)))        # N x 49 x ch
        rms = torch.sqrt(h.pow(2).mean(dim=(1, 2)) + 1e-3)[:, None]  # N x 1
        return self.head(torch.cat([h.amax(dim=1), rms], dim=1))


def mcu_block(rows: int = 128) -> tuple[McuBlock, list[tuple[torch.Tensor]]]:
    """McuBlock with a trained-like LayerNorm (affine away from 1 and 0), and `rows` input rows."""
    torch.manual_seed(0)
    block = McuBlock().eval()
    with torch.no_grad():
        block.norm.weight.uniform_(0.5, 1.5)
        block.norm.bias.uniform_(-0.5, 0.5)
    return block, [(torch.randn(1, 10, 49),) for _ in range(rows)]

