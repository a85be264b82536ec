"""LiteRT.js in headless Chromium runs an artifact and matches ai-edge-litert."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from tpu_pipeline.convert.runtimes import browser
from tpu_pipeline.convert.runtimes.browser import browser_unavailable, run_litertjs
from tpu_pipeline.testing.model_files import tiny_cnn_tflite
from tpu_pipeline.testing.processes import alive

pytestmark = pytest.mark.skipif(browser_unavailable() is not None, reason=f"browser runtime: {browser_unavailable()}")


@pytest.fixture(scope="module")
def tiny_artifact(tmp_path_factory):
    return tiny_cnn_tflite(tmp_path_factory.mktemp("web") / "model.tflite")


def test_browser_outputs_match_torch_and_litert(tiny_artifact, private_tmp):
    from ai_edge_litert.interpreter import Interpreter

    model, path = tiny_artifact
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((1, 1, 8, 8)).astype(np.float32) for _ in range(3)]
    outs = run_litertjs(path, [[x] for x in xs])
    assert list(private_tmp.iterdir()) == []  # Chromium's own temporary folder went with the run's
    with browser.session(webgpu=False):  # the same through a session's browser
        assert np.array_equal(run_litertjs(path, [[xs[0]]])[0][0], outs[0][0])
    assert list(private_tmp.iterdir()) == []
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


def test_a_dropped_poll_does_not_end_the_session(tiny_artifact, monkeypatch):
    # the server drops the page's first two long polls unanswered (a loaded box or a proxy may): the
    # page asks again, and the job runs in the same session instead of waiting out its timeout
    model, path = tiny_artifact
    x = np.random.default_rng(2).standard_normal((1, 1, 8, 8)).astype(np.float32)
    want = run_litertjs(path, [[x]])[0][0]
    real, dropped = browser.Session._next, []

    def flaky(self):
        if len(dropped) < 2:
            dropped.append(time.monotonic())
            raise ConnectionResetError("dropped by the test")
        return real(self)

    monkeypatch.setattr(browser.Session, "_next", flaky)
    with browser.session(webgpu=False):
        got = run_litertjs(path, [[x]], timeout=60)[0][0]
    assert len(dropped) == 2 and np.array_equal(got, want)


def test_browser_rejects_int8_inputs(tiny_artifact):
    from tpu_pipeline.errors import ConversionError

    with pytest.raises(ConversionError, match="float32, int32 or uint8"):
        run_litertjs(tiny_artifact[1], [[np.zeros((1, 1, 8, 8), np.int8)]])


def test_browser_generates_like_the_python_client(tmp_path):
    """A decode-ready LM's greedy loop (prefill + decode signatures) in LiteRT.js."""
    import json

    from transformers import LlamaConfig, LlamaForCausalLM

    from tpu_pipeline.convert.runtimes.browser import generate_litertjs
    from tpu_pipeline.convert.lm.decode_ready import write_decode_ready
    from tpu_pipeline.convert.lm.decode_ready_runtime import LiteRTLanguageModel
    from tpu_pipeline.train.tasks.char_lm import build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         max_position_embeddings=24, eos_token_id=tok.eos_token_id))
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(tmp_path / "hf")
    tok.save_pretrained(tmp_path / "hf")
    meta = write_decode_ready(tmp_path / "hf", tmp_path / "lm", max_len=24, prefill_len=4)
    lm = LiteRTLanguageModel(tmp_path / "lm")
    prompts = [lm.encode("3+4-2="), lm.encode("9-8="), list(range(4, 14))]
    got = generate_litertjs(tmp_path / "lm" / "model.tflite", json.loads((tmp_path / "lm" / "lm.json").read_text()),
                            prompts, 8)
    assert got == [lm.generate_ids(p, 8) for p in prompts]
    assert meta["prefill_len"] == 4 and all(len(g) >= 1 for g in got)


def test_a_conversion_killed_with_sigkill_leaves_no_browser(tmp_path):
    # nothing in the dead process can clean up: the browser must die with the thread that started it
    script = tmp_path / "hold.py"
    script.write_text("import time\nfrom tpu_pipeline.convert.runtimes import browser\n"
                      "s = browser.Session(webgpu=False)\nprint(s.proc.pid, flush=True)\ntime.sleep(120)\n")
    holder = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "TMPDIR": str(tmp_path)})  # the dead holder's folders stay there
    chromium = int(holder.stdout.readline())
    assert alive(chromium)
    holder.kill()
    holder.wait()
    deadline = time.monotonic() + 10
    while alive(chromium) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(chromium)
