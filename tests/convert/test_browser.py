"""LiteRT.js in headless Chromium runs an artifact and matches ai-edge-litert."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tpu_pipeline.convert.browser import browser_unavailable, run_litertjs

pytestmark = pytest.mark.skipif(browser_unavailable() is not None, reason=f"browser runtime: {browser_unavailable()}")


@pytest.fixture(scope="module")
def tiny_artifact(tmp_path_factory):
    import litert_torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 5)).eval()
    path = tmp_path_factory.mktemp("web") / "model.tflite"
    litert_torch.convert(model, (torch.randn(1, 1, 8, 8),)).export(str(path))
    return model, path


def test_browser_outputs_match_torch_and_litert(tiny_artifact):
    from ai_edge_litert.interpreter import Interpreter

    model, path = tiny_artifact
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((1, 1, 8, 8)).astype(np.float32) for _ in range(3)]
    outs = run_litertjs(path, [[x] for x in xs])
    runner = Interpreter(model_path=str(path)).get_signature_runner()
    (in_name,) = runner.get_input_details()
    assert len(outs) == 3
    for x, (y,) in zip(xs, outs):
        assert y.shape == (1, 5) and y.dtype == np.float32
        ref = next(iter(runner(**{in_name: x}).values()))
        np.testing.assert_allclose(y, ref, atol=1e-5)
        with torch.no_grad():
            np.testing.assert_allclose(y, model(torch.from_numpy(x)).numpy(), atol=1e-4)
        assert not np.allclose(y, 0)


def test_browser_rejects_int8_inputs(tiny_artifact):
    from tpu_pipeline.errors import ConversionError

    with pytest.raises(ConversionError, match="float32, int32 or uint8"):
        run_litertjs(tiny_artifact[1], [[np.zeros((1, 1, 8, 8), np.int8)]])
