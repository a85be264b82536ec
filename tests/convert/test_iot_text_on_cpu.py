"""Text models on the iot target: int64 token ids -> nn.Embedding -> Conv1d -> mean ->
Linear, full-integer on the real TFLM interpreter. The embedding lookup becomes an
int8 GATHER (convert/precision/tflite_rewrites.py); these tests check that rewrite is exact in float,
leaves other variants alone, and that the converted classifier passes iot parity
from the CLI, from an nn.Module and from an ExportedProgram."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.tools import flatbuffer_utils
from click.testing import CliRunner

from tpu_pipeline.cli import cli
import tpu_pipeline.convert as tc
from tpu_pipeline.convert.module.export import export_float
from tpu_pipeline.convert.module.loaders import load_object
from tpu_pipeline.convert.precision.quantize import quantize
from tpu_pipeline.convert.precision.tflite_rewrites import has_external_buffers, lookups_as_gather
from tpu_pipeline.convert.runtimes.litert import LitertRunner
from tpu_pipeline.convert.targets import load_profiles
from tpu_pipeline.convert.tflite_info import inspect_model
from tpu_pipeline.testing.convert_models import MODULE as TEST_MODELS
from tpu_pipeline.testing.convert_models import TextCNN
from tpu_pipeline.testing.model_files import manifest

pytestmark = pytest.mark.slow

VOCAB = 2000


def text_cnn() -> TextCNN:
    torch.manual_seed(0)
    return TextCNN(vocab=VOCAB).eval()


def ids(rng, n=1) -> np.ndarray:
    return rng.integers(0, VOCAB, (n, 32)).astype(np.int64)


def ops(model: bytes) -> list[str]:
    return [o["op"] for o in inspect_model(model).ops]


def assert_full_integer(model: bytes) -> None:
    info = inspect_model(model)
    assert "GATHER" in [o["op"] for o in info.ops] and "EMBEDDING_LOOKUP" not in [o["op"] for o in info.ops]
    assert {t["dtype"] for t in info.tensors.values()} == {"int8", "int32"}  # ids, biases, shapes: int32
    (inp,), (out,) = info.inputs, info.outputs
    assert inp.dtype == "int32" and not inp.scale  # token ids, fed as int32 (TFLM has no int64)
    assert out.dtype == "int8" and out.scale > 0


def test_lookup_as_gather_is_exact_in_float_and_only_static_int8_gets_it(tmp_path):
    m = text_cnn()
    float_model = export_float(load_object(m), tmp_path / "float.tflite")
    assert "EMBEDDING_LOOKUP" in ops(float_model)  # what litert-torch makes of nn.Embedding
    gathered = lookups_as_gather(float_model)
    assert ops(gathered) == ["GATHER" if op == "EMBEDDING_LOOKUP" else op for op in ops(float_model)]
    codes = [flatbuffer_utils.get_builtin_code_from_operator_code(c) for c in
             flatbuffer_utils.read_model_from_bytearray(bytearray(gathered)).operatorCodes]
    assert schema.BuiltinOperator.EMBEDDING_LOOKUP not in codes  # no stale code for an interpreter to resolve
    rng = np.random.default_rng(1)
    a = LitertRunner(float_model, inspect_model(float_model), reference=True)
    b = LitertRunner(gathered, inspect_model(gathered), reference=True)
    for _ in range(8):
        x = ids(rng)
        got = b.run([x])[0]
        np.testing.assert_array_equal(got, a.run([x])[0])  # the same rows, bit for bit
        np.testing.assert_allclose(got, m(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-5)
    assert lookups_as_gather(gathered) == gathered  # nothing left to rewrite: bytes unchanged
    # other targets' variants: float32 is the export itself, dynamic int8 keeps its (int8-table) lookup
    assert quantize(float_model, "float32") is float_model
    assert "EMBEDDING_LOOKUP" in ops(quantize(float_model, "dynamic_int8"))


def test_random_token_ids_cover_the_embedding_table():
    m = text_cnn()
    x = torch.tensor([[3, 5, 7] + [0] * 29])  # the example's ids stop at 7; the table has 2000 rows
    assert load_object(m, (x,)).int_high == [VOCAB]
    assert load_object(_Shifted(m), (x,)).int_high == [8]  # ids + 1: an op before the lookup, not followed
    ep = torch.export.export(m, (x,))
    assert load_object(ep, (x,)).int_high == [VOCAB]  # aten.embedding in the exported graph
    assert load_object(torch.export.export(_Shifted(m), (x,)), (x,)).int_high == [8]  # the example's max + 1


class _Shifted(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, ids):
        return self.inner(ids + 1)


def test_text_classifier_passes_iot_from_the_cli(tmp_path):
    model = manifest("TextCNN", tmp_path / "model.pt", vocab=VOCAB)
    out = tmp_path / "dist"
    r = CliRunner().invoke(cli, ["convert", str(model), "--model-class", f"{TEST_MODELS}:TextCNN", "--targets", "iot",
                                 "--out", str(out), "--samples", "16", "--no-latency"])
    assert r.exit_code == 0, r.output
    iot = json.loads((out / "iot" / "model.json").read_text())
    bounds = load_profiles().get("iot")
    p = iot["parity"]
    assert p["runtime"] == "tflite-micro" and p["passed"]
    assert p["cosine_mean"] >= bounds.min_cosine and p["top1"] >= bounds.min_top1
    assert iot["inputs"][0]["dtype"] == "int32" and iot["outputs"][0]["dtype"] == "int8"
    assert any("int64 in PyTorch is int32 in the artifact" in n for n in iot["notes"])
    assert_full_integer((out / "iot" / "model.tflite").read_bytes())
    assert 0 < iot["firmware"]["arena_used_bytes"] < bounds.max_arena_bytes
    assert iot["size_bytes"] < bounds.max_size_bytes


@pytest.mark.parametrize("form,vocab,dim", [("module", VOCAB, 48), ("exported_program", 5000, 64)])
def test_text_classifier_passes_iot_from_the_api(tmp_path, form, vocab, dim):
    """5000 x 64: 320 KB of int8 table, past the 256 KiB from which ai-edge-quantizer writes external
    buffers, which TFLM does not read (it planned the table into the arena and ran out)."""
    torch.manual_seed(0)
    m = TextCNN(vocab=vocab, dim=dim).eval()
    x = torch.randint(0, vocab, (1, 32))
    model = m if form == "module" else torch.export.export(m, (x,))
    result = tc.convert(model, (x,), targets="iot", out=tmp_path / "d", samples=16, latency=False)
    t = result["iot"]
    assert result.passed, t.reasons
    assert t.precision == "static_int8" and t.metrics["runtime"] == "tflite-micro"
    # an in-memory module states no output kind: judged numerically (mean cosine), never top-1 by
    # default (issue 19; this test asserted top-1 on it when every 2-D output was taken for class scores)
    assert t.metrics["cosine_mean"] >= 0.98 and "top1" not in t.metrics
    assert result.report["output_kinds"]["output_0"]["kind"] == "unknown"
    artifact = (tmp_path / "d" / "iot" / "model.tflite").read_bytes()
    assert_full_integer(artifact)
    assert not has_external_buffers(artifact) and len(artifact) > vocab * dim  # the table is in the file
