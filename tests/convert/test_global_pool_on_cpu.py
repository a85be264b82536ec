"""An average pool whose window covers the whole map (Hugging Face EfficientNet's
AvgPool2d(1280, ceil_mode=True)) is exported as a mean: litert-torch's literal lowering
pads the map to the window and folds the divisor into the next weights, beyond float16's
range (the float16 artifact outputs NaN) and gigabytes of padded activations."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tpu_pipeline.convert as tc
from tpu_pipeline.convert.module.global_pool import as_mean


class PooledHead(nn.Module):
    def __init__(self, window: int = 256, ceil_mode: bool = True, padding: int = 0):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 32, 3, stride=2, padding=1)
        self.pool = nn.AvgPool2d(window, ceil_mode=ceil_mode, padding=padding)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc(self.pool(torch.relu(self.conv(x))).flatten(1))


X = (torch.randn(1, 3, 16, 16),)


def test_whole_map_pool_becomes_a_mean_for_modules_and_graphs():
    net = PooledHead().eval()
    new, notes = as_mean(net, X)
    assert new is not net and type(new.pool).__name__ == "_MapMean" and type(net.pool) is nn.AvgPool2d
    assert len(notes) == 1 and notes[0].startswith("1 average pool(s)")
    torch.testing.assert_close(new(*X), net(*X))
    gm = torch.export.export(net, X).module()
    new, notes = as_mean(gm, X)
    targets = [n.target for n in new.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.mean.dim in targets and torch.ops.aten.avg_pool2d.default not in targets
    assert torch.ops.aten.avg_pool2d.default in [n.target for n in gm.graph.nodes]  # the original untouched
    torch.testing.assert_close(new(*X), gm(*X))


@pytest.mark.parametrize("pool", [nn.AvgPool2d(2), nn.AvgPool2d(10, padding=1), nn.AvgPool2d(8, divisor_override=3)])
def test_other_pools_are_left_alone(pool):
    # a 2x2 window; a window over the map whose divisor counts the padding; an overridden divisor
    net = nn.Sequential(pool)
    new, notes = as_mean(net, (torch.randn(1, 3, 8, 8),))
    assert new is net and notes == []


@pytest.mark.slow
def test_float16_variant_of_a_whole_map_pool_passes_android(tmp_path):
    # EfficientNet's pool: the literal lowering would fold x1280^2/64 into fc's weights (x30: up to ~1.4e5,
    # beyond float16's 65504), and its float16 artifact would output inf/NaN
    net = PooledHead(window=1280).eval()
    with torch.no_grad():
        net.fc.weight.mul_(30)
    r = tc.convert(net, X, targets="android", out=tmp_path / "d", latency=False)
    android = r["android"]
    assert android.passed and android.precision == "float16", android.reasons
    assert android.metrics["cosine"] > 0.9999
    assert any("exported as a mean" in n for n in r.report["notes"])
