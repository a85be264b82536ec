"""A torch.export program takes only the shape buckets its graph was exported for (issue 37).

A .pt2 exported without dynamic_shapes is specialised to its one shape; one exported with a
torch.export.Dim runs only inside the Dim's range. Both are refused before anything is exported,
in one line that says what the file was exported with and what to do."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

import tpu_pipeline.convert as tc
from tpu_pipeline.cli import cli
from tpu_pipeline.convert.module.loaders import exported_dims
from tpu_pipeline.errors import EXIT_BAD_INPUT, UserError


class ConvAudio(torch.nn.Module):
    """A conv net over a waveform whose mean pools over time: shape-generic as a module."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(1, 4, 9, stride=4)
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x.unsqueeze(1))).mean(-1))


def _export(length: int, dim=None):
    torch.manual_seed(0)
    dyn = {"x": {1: dim}} if dim is not None else None
    return torch.export.export(ConvAudio().eval(), (torch.randn(1, length),), dynamic_shapes=dyn)


def test_exported_dims_fixed_and_ranged():
    assert exported_dims(_export(400)) == [[(1, 1), (400, 400)]]
    assert exported_dims(_export(400, torch.export.Dim("t", min=100, max=800))) == [[(1, 1), (100, 800)]]


def test_a_pt2_at_one_shape_is_refused_buckets_with_what_to_do(tmp_path):
    path = tmp_path / "audio.pt2"
    torch.export.save(_export(400), path)
    out = tmp_path / "dist"
    r = CliRunner().invoke(cli, ["convert", str(path), "--targets", "desktop", "--out", str(out),
                                 "--shapes", "x=1x100,1x200,1x400"])
    assert r.exit_code == EXIT_BAD_INPUT, r.output
    line = r.output.strip().splitlines()[-1]
    assert "exported at one shape (x 1x400)" in line and "bucket x_1x100" in line
    assert "dynamic_shapes" in line and "torch.export.Dim" in line and "--model-class" in line
    assert "Traceback" not in r.output and not out.exists()


def test_buckets_outside_a_dim_range_are_refused_naming_input_axis_and_range(tmp_path):
    ep = _export(400, torch.export.Dim("t", min=100, max=800))
    with pytest.raises(UserError) as e:
        tc.convert(ep, targets="desktop", out=tmp_path / "d", shapes=("x=1x200,1x1600",))
    msg = str(e.value)
    assert "bucket x_1x1600: input x axis 1 is 1600, outside the range 100..800" in msg
    assert "torch.export.Dim" in msg and not (tmp_path / "d").exists()
    with pytest.raises(UserError, match="axis 0 is 2, but .* fixed at 1"):
        tc.convert(ep, targets="desktop", out=tmp_path / "d", shapes=("x=1x200,2x400",))
