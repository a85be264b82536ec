"""The Python API: `tpu_pipeline.convert.convert` takes an nn.Module with its sample
inputs, an ExportedProgram or a path, and returns a typed ConvertResult."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import tpu_pipeline.convert as tc
from tpu_pipeline.convert import ConvertResult, TargetResult
from tpu_pipeline.convert.reference_models import DepthwiseCNN
from tpu_pipeline.errors import ParityError, UserError

from .models import PlantedMismatchCNN

pytestmark = pytest.mark.slow


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()


def test_module_with_sample_args(tmp_path):
    net = _net()
    result = tc.convert(net, (torch.randn(1, 16),), targets="desktop,android", out=tmp_path / "d", samples=4,
                        latency=False)
    assert isinstance(result, ConvertResult) and result.passed and result.exit_code == 0
    assert list(result.targets) == ["android", "desktop"]
    desk = result["desktop"]
    assert isinstance(desk, TargetResult) and desk.passed and desk.precision == "float32" and desk.reasons == []
    assert desk.artifact_path == str(tmp_path / "d" / "desktop" / "model.tflite")
    assert desk.metrics["cosine"] > 0.99999 and desk.metrics["outputs"]["output_0"]["samples"] == 4
    assert desk.latency is None  # latency=False
    report = json.loads((tmp_path / "d" / "report.json").read_text())
    assert report["model"] == "Sequential (in memory)" and report["source_format"] == "nn.Module"
    assert report["targets"]["android"]["quantization"] == result["android"].precision
    # the artifact computes what the module computes
    from ai_edge_litert.interpreter import Interpreter

    x = torch.randn(1, 16)
    runner = Interpreter(model_path=desk.artifact_path).get_signature_runner()
    (got,) = runner(**{next(iter(runner.get_input_details())): x.numpy()}).values()
    np.testing.assert_allclose(got, net(x).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_exported_program_and_calibration_rows(tmp_path):
    torch.manual_seed(0)
    ep = torch.export.export(DepthwiseCNN().eval(), (torch.randn(1, 1, 8, 8),))
    rows = [(torch.randn(1, 1, 8, 8),) for _ in range(16)]
    result = tc.convert(ep, targets=["iot"], out=tmp_path / "d", calibration=rows, latency=False)
    assert result.passed, result["iot"].reasons
    assert result.report["source_format"] == "torch.export program"
    assert result.report["warnings"] == []  # calibrated on the rows given, not random inputs
    assert result.report["sample_source"].startswith("calibration (last 8 rows")
    assert result["iot"].precision == "static_int8" and result["iot"].metrics["runtime"] == "tflite-micro"


def test_failed_target_is_a_result_and_raises_on_request(tmp_path):
    torch.manual_seed(0)
    result = tc.convert(PlantedMismatchCNN().eval(), targets="desktop", out=tmp_path / "d", samples=2,
                        latency=False)
    assert not result.passed and result.exit_code == 4
    assert result["desktop"].reasons and result["desktop"].artifact_path.endswith("desktop/failed/model.tflite")
    with pytest.raises(ParityError) as e:
        result.raise_for_failures()
    assert e.value.result is result and "desktop:" in str(e.value)


def test_bad_api_input_is_one_line_user_error(tmp_path):
    with pytest.raises(UserError, match="pass sample_args"):
        tc.convert(_net(), out=tmp_path / "d")
    with pytest.raises(UserError, match="unknown option.*smaples"):
        tc.convert(_net(), (torch.randn(1, 16),), smaples=3)
    with pytest.raises(UserError, match="--model-class applies to a model path only"):
        tc.convert(_net(), (torch.randn(1, 16),), model_class="x:Y")
    with pytest.raises(UserError, match="not int"):
        tc.convert(3)
    assert not (tmp_path / "d").exists()
