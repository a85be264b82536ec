"""The Python API: `tpu_pipeline.convert.convert` takes an nn.Module with its sample
inputs, an ExportedProgram or a path, and returns a typed ConvertResult."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import tpu_pipeline.convert as tc
from tpu_pipeline.convert import ConvertResult, TargetResult
from tpu_pipeline.errors import ParityError, UserError
from tpu_pipeline.testing.convert_models import PlantedMismatchCNN
from tpu_pipeline.testing.explorer import explorer_nodes
from tpu_pipeline.testing.reference_models import DepthwiseCNN

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
    result = tc.convert(ep, targets=["iot"], out=tmp_path / "d", calibration=rows, latency=False, samples=8)
    assert result.passed, result["iot"].reasons
    assert result.report["source_format"] == "torch.export program"
    assert result.report["warnings"] == []  # calibrated on the rows given, not random inputs
    assert result.report["sample_source"].startswith("calibration (8 rows drawn, held out")
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


class _TinyWeights(torch.nn.Module):
    """Weights near 1e-9: float16 flushes them to zero, int8 (per-channel scales) keeps them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(16, 4)
        with torch.no_grad():
            self.fc.weight.mul_(1e-8)
            self.fc.bias.zero_()

    def forward(self, x):
        return self.fc(x)


def test_precision_chosen_by_measurement_and_precision_loss_diagnosed(tmp_path):
    net, x = _TinyWeights().eval(), (torch.randn(1, 16),)
    result = tc.convert(net, x, targets="desktop,android", out=tmp_path / "a", samples=4)
    android = result["android"]
    assert result.passed and android.precision == "dynamic_int8", android.chosen_because
    cands = {c["precision"]: c for c in android.candidates}
    assert not cands["float16"]["passed"] and cands["float16"]["failure"] == "parity"
    assert cands["dynamic_int8"]["chosen"] and "float16 failed parity" in android.chosen_because
    # with float16 the only precision allowed, the target fails as precision loss, not conversion error
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    for f in (Path(tc.__file__).parent / "targets").glob("*.toml"):
        text = f.read_text()
        if f.stem == "android":
            text = text.replace('precisions = ["float16", "dynamic_int8", "static_int8_float_io"]', 'precisions = ["float16"]')
        (profiles / f.name).write_text(text)
    result = tc.convert(net, x, targets="android", out=tmp_path / "b", samples=4, latency=False,
                        profile_dir=profiles)
    android = result["android"]
    assert result.exit_code == 4 and android.failure == "parity" and android.candidates is None
    assert result.report["float_export"]["passed"] is True  # judged as desktop, though not asked for
    diag = android.metrics["diagnosis"]
    assert diag.startswith("precision loss (float16): the float32 export matches PyTorch")
    assert android.metrics["vs_float"]["cosine"] < 0.5 and diag in android.reasons


class _Overflows16(torch.nn.Module):
    """Fine in float32; its scaled-up middle overflows float16's 65504 on a phone GPU."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.out = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)
        self.up, self.down = _Scale(1e5), _Scale(1e-5)

    def forward(self, x):
        return self.out(self.down(self.up(self.inp(x))))


class _Scale(torch.nn.Module):
    def __init__(self, k: float):
        super().__init__()
        self.k = k

    def forward(self, x):
        return x * self.k


def test_float16_activation_sensitivity(tmp_path):
    result = tc.convert(_Overflows16().eval(), (torch.randn(1, 8),), targets="desktop,android", out=tmp_path / "d",
                        samples=4, latency=False)
    assert result["desktop"].passed and not result["android"].passed and result.exit_code == 4
    f16 = result["android"].metrics["float16_activations"]
    assert f16["measured"] and f16["first_nonfinite"] == "up (inf)" and not f16["outputs"]["output_0"]["finite"]
    assert any("does not run in float16" in e and "first at up (inf)" in e for e in result["android"].reasons)
    assert "float16_activations" not in result["desktop"].metrics  # CPU float32 target: not judged
    ok = tc.convert(_net(), (torch.randn(1, 16),), targets="android", out=tmp_path / "e", samples=4, latency=False)
    f16 = ok["android"].metrics["float16_activations"]
    assert ok.passed and f16["first_nonfinite"] is None and f16["outputs"]["output_0"]["cosine"] > 0.999
    assert f16["layers_seen"] == 3  # Linear, ReLU, Linear


class _Hostile(torch.nn.Module):
    """fc2 is hostile to int8: an outlier weight per output channel (on an input that is always 0)
    sets each channel's int8 scale, and every other weight rounds to 0."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.fc3 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 10)
        with torch.no_grad():
            self.fc1.weight[0], self.fc1.bias[0] = 0.0, -1.0  # channel 0 is 0 after ReLU
            self.fc2.weight[:, 0] = 100.0

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def test_accuracy_aware_quantization_keeps_the_hostile_layer_in_float(tmp_path):
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    for f in (Path(tc.__file__).parent / "targets").glob("*.toml"):
        text = f.read_text()
        if f.stem == "web":  # dynamic int8 only, and no browser run: the rounds are what is tested
            text = text.replace('precisions = ["float16", "dynamic_int8", "static_int8_float_io"]', 'precisions = ["dynamic_int8"]')
            text = text.replace("browser_parity = true", "browser_parity = false")
        (profiles / f.name).write_text(text)
    net, x = _Hostile().eval(), (torch.randn(1, 32),)
    off = tc.convert(net, x, targets="web", out=tmp_path / "off", profile_dir=profiles, refine_rounds=0)
    web = off["web"]
    assert not web.passed and web.metrics["cosine_mean"] < 0.9 and web.kept_float is None
    assert web.metrics["first_divergence"]["module"] == "fc2"
    on = tc.convert(net, x, targets="web", out=tmp_path / "on", profile_dir=profiles)
    web = on["web"]
    assert on.passed and web.precision == "dynamic_int8" and web.metrics["cosine_mean"] > 0.999
    kept = web.kept_float
    assert kept["layers"] == ["fc2"] and kept["passed"] and len(kept["rounds"]) == 1
    # fc2's 4096 weights in float32 instead of int8: ~3 bytes more each, less their int8 scales
    assert 2.5 * 64 * 64 < kept["bytes_added"] == web.size_bytes - off["web"].size_bytes <= 3 * 64 * 64
    assert kept["latency_ms_after"] > 0 and "fc2 kept in float32" in web.chosen_because
    report = json.loads((tmp_path / "on" / "report.json").read_text())
    assert report["targets"]["web"]["kept_float"]["layers"] == ["fc2"]
    page = (tmp_path / "on" / "report.html").read_text()
    assert "layers kept in float32: fc2 (passes; +" in page and "chosen: dynamic_int8 missed its bound" in page
    # where the numbers went wrong, as Model Explorer overlays: on the failing artifact, and on the shipped
    # one for the layers that lost precision before fc2 was kept in float32
    _assert_overlay(tmp_path / "off" / "web" / "failed", "fc2", "this artifact (dynamic_int8)")
    _assert_overlay(tmp_path / "on" / "web", "fc2", "dynamic_int8, before keeping fc2 in float32")
    assert report["targets"]["web"]["layer_errors"]["file"] == str(tmp_path / "on" / "web" / "layer_errors.json")
    assert "every layer's error in Model Explorer: <code>model-explorer " in page


def _assert_overlay(folder: Path, worst: str, measured_on: str) -> None:
    from model_explorer.node_data_builder import GraphNodeData, NodeDataResult, ThresholdItem

    data = json.loads((folder / "layer_errors.json").read_text())
    meta = json.loads((folder / "model.json").read_text())["layer_errors"]
    assert meta["measured_on"] == measured_on
    assert meta["view"] == (f"model-explorer {folder / 'model.tflite'} --node_data_paths "
                            f"{folder / 'layer_errors.json'}")
    # Model Explorer's own node-data types take the file as it is
    built = GraphNodeData(results={k: NodeDataResult(**v) for k, v in data["results"].items()},
                          thresholds=[ThresholdItem(**x) for x in data["thresholds"]])
    assert set(data) == {"results", "thresholds"}  # an unknown field would have raised above
    assert {k: v for k, v in json.loads(built.to_json_string()).items() if k in data} == data
    # every key is an op node of the artifact beside it, and the blamed layer is the one past the threshold
    nodes = explorer_nodes(folder / "model.tflite")
    assert data["results"] and set(data["results"]) <= set(nodes), set(data["results"]) - set(nodes)
    green, yellow = data["thresholds"][0]["value"], data["thresholds"][1]["value"]
    values = list(data["results"].items())  # in execution order
    first_red = next(k for k, v in values if v["value"] > yellow)
    assert f"Linear_{worst};" in first_red, (first_red, worst)
    assert values[0][1]["value"] <= green and "Linear_fc1;" in values[0][0]  # fc1 matched: green
    assert [nodes[k] for k in data["results"]] == ["fully_connected"] * len(data["results"])
