"""What apps and firmware take next to an artifact: the iot C array with the
arena TFLM really needed, and the android/ios loader snippets."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from tpu_pipeline.convert.iot.firmware import measure_arena, suggested_arena, write_c_array
from tpu_pipeline.convert.snippets import render, render_lm, write_snippet
from tpu_pipeline.errors import ConversionError
from tpu_pipeline.files import sha256_file
from tpu_pipeline.testing.model_files import tiny_cnn_tflite


@pytest.fixture(scope="module")
def int8_model(tmp_path_factory):
    from ai_edge_litert.interpreter import Interpreter

    from tpu_pipeline.convert.precision.quantize import quantize

    _, path = tiny_cnn_tflite(tmp_path_factory.mktemp("iot") / "float.tflite", channels=8, classes=10)
    float_model = path.read_bytes()
    (name,) = Interpreter(model_content=float_model).get_signature_runner().get_input_details()
    rng = np.random.default_rng(0)
    calib = [{name: rng.standard_normal((1, 1, 8, 8)).astype(np.float32)} for _ in range(8)]
    return quantize(float_model, "static_int8", calib)


def test_arena_is_what_tflm_needs(int8_model):
    used = measure_arena(int8_model)
    assert 256 < used < 64 * 1024
    assert measure_arena(int8_model, max_arena=suggested_arena(used)) == used
    with pytest.raises(ConversionError, match="TFLM could not run"):
        measure_arena(int8_model, max_arena=used // 4)


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
def test_c_array_compiles_and_holds_the_exact_bytes(int8_model, tmp_path):
    model = tmp_path / "model.tflite"
    model.write_bytes(int8_model)
    paths = write_c_array(int8_model, tmp_path, arena_used=2384, sha256=sha256_file(model))
    assert [p.name for p in paths] == ["model_data.h", "model_data.cc"]
    (tmp_path / "main.cc").write_text(
        '#include <cstdint>\n#include <cstdio>\n#include "model_data.h"\n'
        "int main() {\n"
        "  if (reinterpret_cast<uintptr_t>(g_model_data) % 16) return 3;\n"
        "  std::printf(\"%zu %zu\\n\", g_model_arena_used_bytes, g_model_tensor_arena_size);\n"
        "  std::fwrite(g_model_data, 1, g_model_data_len, stderr);\n  return 0;\n}\n")
    subprocess.run(["g++", "-std=c++17", "-o", str(tmp_path / "probe"), str(tmp_path / "main.cc"),
                    str(tmp_path / "model_data.cc")], check=True, cwd=tmp_path)
    out = subprocess.run([str(tmp_path / "probe")], capture_output=True, check=True)
    assert out.stderr == int8_model
    used, size = map(int, out.stdout.split())
    assert used == 2384 and size == suggested_arena(2384) and size % 16 == 0 and size > used


MODEL_JSON = {
    "target": "android", "quantization": "float16",
    "inputs": [{"name": "input_ids", "shape": [1, 12], "dtype": "int32", "quantization": None},
               {"name": "pixel values", "shape": [1, 3, 4, 4], "dtype": "float32", "quantization": None}],
    "outputs": [{"name": "logits", "shape": [1, 12, 40], "dtype": "float32", "quantization": None}],
}


def test_android_snippet_uses_real_names_shapes_and_dtypes(tmp_path):
    path = write_snippet("kotlin", MODEL_JSON, tmp_path, "policy")
    text = path.read_text()
    assert path.name == "ModelRunner.kt"
    assert "fun run(inputIds: IntArray, pixelValues: FloatArray): FloatArray" in text
    assert "require(inputIds.size == 12)" in text and "require(pixelValues.size == 48)" in text
    assert "inputs[0].writeInt(inputIds)" in text and "inputs[1].writeFloat(pixelValues)" in text
    assert "// output 'logits': shape [1, 12, 40], float32" in text
    assert "CompiledModel.create(" in text and "${" not in text
    assert "for policy: android target, float16" in text


def test_ios_snippet_and_int8_quantization_note(tmp_path):
    mj = {**MODEL_JSON, "quantization": "static_int8",
          "inputs": [{"name": "x", "shape": [1, 8], "dtype": "int8", "quantization": {"scale": 0.5, "zero_point": -3}}],
          "outputs": [{"name": "y", "shape": [1, 2], "dtype": "int8", "quantization": {"scale": 0.25, "zero_point": 1}}]}
    text = render("swift", mj, "tiny")
    assert "func run(_ x: [Int8]) throws -> [Int8]" in text
    assert "scale 0.5, zero point -3" in text and "precondition(x.count == 8)" in text
    assert write_snippet("", mj, tmp_path, "tiny") is None


LM_MODEL_JSON = {
    "target": "android", "quantization": "weight_only_int8", "kind": "decode-ready-lm",
    "litertlm": {"file": "model.litertlm", "size_bytes": 2306000, "cache_length": 96, "prefill_length": 16,
                 "exporter": "litert-torch export_hf",
                 "sampler": {"type": "TOP_P", "top_k": 40, "top_p": 0.95, "temperature": 0.7, "seed": 0}},
}


def test_lm_snippets_run_the_bundle_with_its_sampler_defaults(tmp_path):
    """An LM target's model.json (a `litertlm` entry) gets LiteRT-LM snippets, not the tensor loader:
    the bundle's file name, its KV-cache length and the sampler written into the bundle."""
    kt = write_snippet("kotlin", LM_MODEL_JSON, tmp_path, "policy")
    assert kt.name == "LlmRunner.kt" and not (tmp_path / "ModelRunner.kt").exists()
    text = kt.read_text()
    assert 'modelPath = "$modelDir/model.litertlm"' in text and "maxNumTokens = 96," in text
    assert "SamplerConfig(topK = 40, topP = 0.95, temperature = 0.7, seed = 0)" in text
    assert "engine.createConversation(ConversationConfig(samplerConfig = sampler))" in text
    assert "for policy: android target, weight_only_int8" in text and "${" not in text
    swift = write_snippet("swift", {**LM_MODEL_JSON, "target": "ios"}, tmp_path, "policy").read_text()
    assert 'Bundle.main.path(forResource: "model", ofType: "litertlm")' in swift and "maxNumTokens: 96," in swift
    assert "try? SamplerConfig(topK: 40, topP: 0.95, temperature: 0.7, seed: 0)" in swift
    assert "TOP_P, top_k 40, top_p 0.95, temperature 0.7" in swift
    # no sampler in the bundle: none is passed (the engine's own defaults), and the snippet says so
    bare = {**LM_MODEL_JSON, "litertlm": {**LM_MODEL_JSON["litertlm"], "sampler": None}}
    assert "private val sampler: SamplerConfig? = null" in render_lm("kotlin", bare, "policy")
    assert "no sampler defaults" in render_lm("swift", bare, "policy")
