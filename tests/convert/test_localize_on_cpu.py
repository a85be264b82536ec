"""Localization and loading for .pt2 inputs: a planted error inside an exported program
is named by its module path (through the graph's nn_module_stack, since an exported
program's submodules never run as modules), and an archive of a Hugging Face model that
returns its ModelOutput loads and converts."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import torch

import tpu_pipeline.convert as tc
import tpu_pipeline.convert.module.kind as module_kind
from tpu_pipeline.convert.module.loaders import load_model
from tpu_pipeline.testing import zoo
from tpu_pipeline.testing.explorer import explorer_nodes
from tpu_pipeline.testing.reference_models import DepthwiseCNN

pytestmark = pytest.mark.slow


def test_planted_error_in_exported_program_is_localized(tmp_path, monkeypatch):
    torch.manual_seed(0)
    ep = torch.export.export(DepthwiseCNN().eval(), (torch.randn(1, 1, 8, 8),))
    torch.export.save(ep, tmp_path / "m.pt2")
    real_export = module_kind.export_float

    def wrong_export(m, path):
        # the converter gets blocks.3 (a pointwise conv) wrong: the artifact departs there
        m = copy.copy(m)
        m.module = copy.deepcopy(m.module)
        with torch.no_grad():
            m.module.get_submodule("blocks.3").weight.mul_(1.5)
        return real_export(m, path)

    monkeypatch.setattr(module_kind, "export_float", wrong_export)
    result = tc.convert(tmp_path / "m.pt2", targets="desktop,android", out=tmp_path / "d", samples=2,
                        latency=False)
    assert result.exit_code == 4
    desk, android = result["desktop"], result["android"]
    assert desk.errors[0].startswith("conversion error: the float32 export does not match PyTorch")
    loc = desk.metrics["first_divergence"]
    # LiteRT fuses conv + BatchNorm + ReLU6 into one op named by its output (blocks.5); the
    # planted layer is named among the modules the op computes
    assert loc["op"] == "CONV_2D" and (loc["module"] == "blocks.3" or "blocks.3" in loc.get("fused_with", "")), loc
    assert "first diverging layer: blocks." in " ".join(desk.errors) and "blocks.3" in " ".join(desk.errors)
    before = [row["rel_err"] for row in loc["layers"] if row["op_index"] < loc["op_index"]]
    assert len(before) == 2 and max(before) < 1e-4  # stem and the depthwise block before it matched
    # a conversion error fails every target derived from the export, named as such
    assert not android.passed and android.failure == "parity" and android.artifact is None
    assert android.errors[0].startswith("conversion error: the float32 export does not match PyTorch")
    report = json.loads((tmp_path / "d" / "report.json").read_text())
    assert report["float_export"]["passed"] is False and report["exit_code"] == 4
    # the layers coloured by that error, beside the failed artifact, for Model Explorer
    failed = tmp_path / "d" / "desktop" / "failed"
    overlay = json.loads((failed / "layer_errors.json").read_text())["results"]
    nodes = explorer_nodes(failed / "model.tflite")
    assert set(overlay) <= set(nodes) and len(overlay) == len(loc["layers"])
    red = [k for k, v in overlay.items() if v["value"] > loc["threshold"]]
    assert red and nodes[red[0]] == "conv_2d" and abs(overlay[red[0]]["value"] - loc["rel_err"]) < 1e-12
    assert report["targets"]["desktop"]["layer_errors"]["measured_on"] == "this artifact (float32)"


def test_hf_model_output_archive_loads_and_converts(tmp_path):
    built = zoo.build("resnet")
    path = zoo.save_raw_hf_pt2(built, tmp_path / "resnet.pt2")
    # a fresh interpreter, as the CLI starts: nothing has imported transformers' output classes
    code = ("import sys; from tpu_pipeline.convert.module.loaders import load_model; "
            "m = load_model(sys.argv[1]); print(m.source_format, len(m.output_names))")
    fresh = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300)
    assert fresh.returncode == 0 and fresh.stdout.strip().endswith("torch.export archive 1"), fresh.stderr[-2000:]
    m = load_model(path)
    assert m.source_format == "torch.export archive" and m.output_names and len(m.output_names) >= 1
    with torch.no_grad():
        want = built.hf_model(*built.sample_args).logits
    got = m.module(*built.sample_args)
    assert torch.allclose(got.logits if hasattr(got, "logits") else got[0], want, atol=1e-5)
    result = tc.convert(path, targets="desktop", out=tmp_path / "d", samples=2, latency=False)
    assert result.passed, result["desktop"].reasons
    assert result["desktop"].metrics["cosine"] > 0.9999
