"""LiteRT's GPU accelerator (android) and LiteRT.js's WebGPU backend (web) run here on
Chromium's SwiftShader (Vulkan on the CPU): no GPU is needed, so these are CPU tests. Where
SwiftShader or the Vulkan loader is missing (`make browser` installs both), the tests that need
the accelerator to start skip with the reason; the planted failures run everywhere."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import tpu_pipeline.convert as tc
from tpu_pipeline.convert.runtimes import browser
from tpu_pipeline.convert.runtimes.browser import browser_unavailable, run_litertjs_on
from tpu_pipeline.convert.runtimes.litert import gpu_environment, run_gpu
from tpu_pipeline.convert.targets import profile_dir
from tpu_pipeline.convert.tflite_info import inspect_model
from tpu_pipeline.errors import EXIT_PARITY
from tpu_pipeline.testing.model_files import tiny_cnn_tflite
from tpu_pipeline.testing.processes import descendants

_NO_GPU = gpu_environment()[1]
needs_gpu = pytest.mark.skipif(_NO_GPU is not None, reason=f"GPU accelerator: {_NO_GPU}")
needs_browser = pytest.mark.skipif(browser_unavailable() is not None,
                                   reason=f"browser runtime: {browser_unavailable()}")


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    model, path = tiny_cnn_tflite(tmp_path_factory.mktemp("gpu") / "model.tflite")
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((1, 1, 8, 8)).astype(np.float32) for _ in range(3)]
    with torch.no_grad():
        ref = [model(torch.from_numpy(x)).numpy() for x in xs]
    return path.read_bytes(), xs, ref


@pytest.fixture
def bad_icd(tmp_path, monkeypatch):
    """A Vulkan driver manifest naming a library that does not exist: the accelerator cannot start."""
    icd = tmp_path / "bad_icd.json"
    icd.write_text(json.dumps({"file_format_version": "1.0.0",
                               "ICD": {"library_path": str(tmp_path / "no_such_driver.so"), "api_version": "1.1.0"}}))
    monkeypatch.setenv("VK_ICD_FILENAMES", str(icd))
    return icd


def _counted(init, calls: list):
    def wrapped(self, *a, **kw):
        calls.append(kw)
        return init(self, *a, **kw)
    return wrapped


def _small_cnn():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 10)).eval(), (torch.randn(1, 1, 8, 8),)


def _profiles(tmp_path, targets=("android",), **fields):
    """The shipped profiles with these targets' fields set to these TOML values."""
    d = tmp_path / "profiles"
    shutil.copytree(profile_dir(), d)
    for target in targets:
        path = d / f"{target}.toml"
        text = path.read_text()
        for key, value in fields.items():
            line = next(ln for ln in text.splitlines() if ln.startswith(key + " "))
            text = text.replace(line, f"{key} = {value}  # set by the test")
        path.write_text(text)
    return d


@needs_gpu
def test_gpu_accelerator_runs_a_conv_net_fully_accelerated(cnn):
    model, xs, ref = cnn
    run = run_gpu(model, inspect_model(model), [[x] for x in xs])
    assert run.started and run.reason is None, run.reason
    assert run.fully_accelerated is True
    assert "SwiftShader" in (run.adapter or "")
    assert len(run.outputs) == 3
    for (y,), r in zip(run.outputs, ref):
        assert y.shape == r.shape == (1, 5) and not np.allclose(y, 0)
        # SwiftShader computes float32: the float32 artifact matches PyTorch to float32 rounding
        np.testing.assert_allclose(y, r, atol=1e-5, rtol=0)


def test_gpu_accelerator_that_cannot_start_says_why(cnn, bad_icd):
    model, xs, _ = cnn
    run = run_gpu(model, inspect_model(model), [[xs[0]]])
    assert run.started is False and run.outputs is None
    assert run.vulkan_icd == str(bad_icd) or _NO_GPU  # the user's driver is kept, not replaced by SwiftShader
    assert "did not start" in run.reason or "Vulkan loader" in run.reason
    if _NO_GPU is None:
        assert "No adapters found" in run.reason  # Dawn's own words, from LiteRT's log


@pytest.mark.slow
@needs_gpu
@needs_browser
def test_convert_checks_android_on_the_gpu_and_web_on_webgpu(tmp_path, monkeypatch):
    net, x = _small_cnn()
    sessions = []
    monkeypatch.setattr(browser.Session, "__init__", _counted(browser.Session.__init__, sessions))
    monkeypatch.setattr(browser, "_serve_and_wait", None)  # a browser started per run would fail here
    before = descendants()
    # float16 only: dynamic int8 can win on latency noise (the model runs in microseconds), and its
    # CPU kernel quantizes activations, which the accelerators do not, so the 1e-5 bounds below would not hold
    float16 = _profiles(tmp_path, targets=("android", "web"), precisions='["float16"]')
    result = tc.convert(net, x, targets="android,web", out=tmp_path / "out", profile_dir=float16)
    assert result.passed, {n: t.errors for n, t in result.targets.items()}
    assert len(sessions) == 1 and not browser._active  # one browser ran wasm and WebGPU, and is closed
    assert descendants() <= before  # it, its helpers, the GPU worker
    android = json.loads((tmp_path / "out" / "android" / "model.json").read_text())["parity"]
    gpu = android["gpu_accelerator"]
    assert gpu["done"] and gpu["started"] and gpu["passed"] and gpu["fully_accelerated"] is True
    assert "GPU accelerator run" in gpu["check"] and "float16 emulation" in android["float16_activations"]["check"]
    # the float16-weight artifact computed in float32 on SwiftShader: as close to PyTorch as XNNPACK is
    assert gpu["max_abs"] < 1e-3 and gpu["cosine"] > 0.99999 and gpu["max_abs_vs_cpu"] < 1e-5
    web = result.targets["web"].parity
    assert web["webgpu"]["done"] and web["webgpu"]["passed"] and web["webgpu"]["fully_accelerated"] is True
    assert web["webgpu"]["adapter"]["architecture"] == "swiftshader"
    assert web["webgpu"]["max_abs_vs_cpu"] < 1e-5 and "passed" in web["browser"]  # beside wasm, not instead
    html = (tmp_path / "out" / "report.html").read_text()
    assert "GPU accelerator run" in html and "WebGPU run" in html and "float16 emulation" in html


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["try", "require"])
def test_gpu_accelerator_not_started_is_not_done_and_fails_closed_when_required(tmp_path, bad_icd, mode):
    net, x = _small_cnn()
    result = tc.convert(net, x, targets="android", out=tmp_path / "out", latency=False,
                        profile_dir=_profiles(tmp_path, gpu_accelerator=f'"{mode}"', precisions='["float16"]'))
    t = result.targets["android"]
    gpu = t.parity["gpu_accelerator"]
    assert gpu["done"] is False and gpu["started"] is False and gpu["reason"]
    assert "passed" not in gpu and "max_abs" not in gpu  # no figures for a check that did not run
    if mode == "require":
        assert not t.passed and result.exit_code == EXIT_PARITY
        assert any("GPU accelerator check not done" in e and "requires it" in e for e in t.errors), t.errors
    else:
        assert t.passed
        assert any("GPU accelerator check not done" in w for w in t.warnings), t.warnings


class Spectrum(torch.nn.Module):
    """Magnitudes of a real FFT: RFFT2D and complex tensors, which the GPU delegate leaves to the CPU."""

    def forward(self, x):
        return torch.fft.rfft(x).abs()


@pytest.mark.slow
@needs_gpu
def test_ops_the_gpu_cannot_run_are_named_and_run_on_the_cpu(tmp_path):
    x = torch.randn(1, 4, 8)
    result = tc.convert(Spectrum().eval(), (x,), targets="android", out=tmp_path / "out", latency=False)
    t = result.targets["android"]
    gpu = t.parity["gpu_accelerator"]
    assert gpu["started"] and gpu["fully_accelerated"] is False
    assert {"RFFT2D", "COMPLEX_ABS"} <= set(gpu["fallback_ops"]) and "GPU delegate" in gpu["fallback_ops_by"]
    assert "will run on the CPU" in gpu["split"]
    # partly on the GPU, partly on the CPU: still computed, and judged like any run
    assert gpu["done"] and gpu["passed"] and gpu["max_abs"] < 1e-4
    assert any("fall back to the CPU" in w and "RFFT2D" in w for w in t.warnings), t.warnings


@needs_browser
def test_webgpu_backend_matches_torch(cnn):
    model, xs, ref = cnn
    outs, ran = run_litertjs_on("webgpu", model, [[x] for x in xs])
    assert ran["accelerator"] == "webgpu" and ran["fully_accelerated"] is True
    assert ran["adapter"]["architecture"] == "swiftshader"
    for (y,), r in zip(outs, ref):
        np.testing.assert_allclose(y, r, atol=1e-5, rtol=0)
