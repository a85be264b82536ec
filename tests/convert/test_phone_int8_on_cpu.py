"""Static int8 on the phone and web targets (issue 40): float model I/O around an int8 graph,
none of the microcontroller rewrites, XNNPACK's plan (partitions, ops left to other kernels) on
every candidate, and the int8 ops XNNPACK has no kernel for kept float32 only when measured
faster. Tiny models, few rows; no assertion depends on a timing."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import tpu_pipeline.convert as tc
from tpu_pipeline.convert.kinds import Artifact
from tpu_pipeline.convert.module.export import export_float
from tpu_pipeline.convert.module.kind import ModuleKind
from tpu_pipeline.convert.module.loaders import load_object
from tpu_pipeline.convert.options import ConvertOptions
from tpu_pipeline.convert.precision import xnnpack_int8
from tpu_pipeline.convert.precision.quantize import quantize
from tpu_pipeline.convert.runtimes.delegation import splits_more, xnnpack_plan
from tpu_pipeline.convert.runtimes.litert import LitertRunner
from tpu_pipeline.convert.tflite_info import inspect_model


class _CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 16, 3, stride=2), nn.Linear(16, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.c2(torch.relu(self.c1(x)))).mean((2, 3)))


class _Block(nn.Module):
    """LayerNorm, attention (BATCH_MATMUL, SOFTMAX) and a GELU MLP: ops XNNPACK runs in float32
    but not in int8."""

    def __init__(self, d=16):
        super().__init__()
        self.norm, self.qkv, self.mlp, self.head = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d), nn.Linear(d, 3)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, -1)
        x = x + torch.softmax(q @ k.transpose(1, 2) / 4.0, -1) @ v
        return self.head(nn.functional.gelu(self.mlp(x)).mean(1))


def _float_and_rows(module, shape, n=8, seed=0):
    torch.manual_seed(seed)
    m = load_object(module.eval(), (torch.randn(*shape),))
    with tempfile.TemporaryDirectory() as d:
        fm = export_float(m, Path(d) / "f.tflite")
    key = inspect_model(fm).inputs[0].key
    g = np.random.default_rng(seed)
    return fm, [{key: g.standard_normal(shape).astype(np.float32)} for _ in range(n)]


@pytest.fixture(scope="module")
def block():
    return _float_and_rows(_Block(), (1, 8, 16))


def test_float_io_int8_has_float_inputs_outputs_and_no_mcu_rewrites(block):
    fm, rows = block
    phone, mcu = quantize(fm, "static_int8_float_io", rows), quantize(fm, "static_int8", rows)
    pi, mi = inspect_model(phone), inspect_model(mcu)
    assert [t.dtype for t in pi.inputs + pi.outputs] == ["float32", "float32"]
    assert [t.dtype for t in mi.inputs + mi.outputs] == ["int8", "int8"]
    ops_phone, ops_mcu = {o["op"] for o in pi.ops}, {o["op"] for o in mi.ops}
    assert "GELU" in ops_phone and "GATHER" not in ops_phone  # GELU as XNNPACK takes it, no lookup table
    assert "GELU" not in ops_mcu and "GATHER" in ops_mcu       # the TFLM table stays the iot form
    # int8 inside: the FULLY_CONNECTED weights are int8 in both
    fc_w = [pi.tensors[o["inputs"][1]]["dtype"] for o in pi.ops if o["op"] == "FULLY_CONNECTED"]
    assert fc_w and set(fc_w) == {"int8"}
    x = rows[0][pi.inputs[0].key]
    want = LitertRunner(fm, inspect_model(fm)).run([x])[0]
    got = LitertRunner(phone, pi).run([x])[0]
    cos = float(np.dot(want.ravel(), got.ravel()) / np.linalg.norm(want) / np.linalg.norm(got))
    assert cos > 0.9, cos  # the same model, int8-rounded (fed floats, no scale handling by the caller)


def test_xnnpack_plan_counts_partitions_and_the_ops_left(block):
    fm, rows = block
    base = xnnpack_plan(fm)
    # float32: XNNPACK takes all but q @ k^T (a FULLY_CONNECTED whose weights are an activation)
    assert base["partitions"] == 2 and base["left"] == {"FULLY_CONNECTED": 1} and base["ops"] > 20, base
    assert base["delegated"] == base["ops"] - 1
    int8 = xnnpack_plan(quantize(fm, "static_int8_float_io", rows))
    # which int8 ops XNNPACK takes depends on the CPU (BATCH_MATMUL is left on one x86 and delegated on
    # another); GELU has no int8 kernel on any, so the int8 graph always splits further than float32
    assert int8["partitions"] > base["partitions"] and "GELU" in int8["left"], int8["left"]
    assert int8["ops"] - int8["delegated"] == sum(int8["left"].values()) == len(int8["left_scopes"])
    line = splits_more(int8, base)
    assert line and f"{int8['partitions']} partition(s)" in line and "GELU" in line
    assert splits_more(base, base) is None


def test_ops_without_an_int8_kernel_are_kept_float_only_when_faster(block):
    fm, rows = block
    int8 = quantize(fm, "static_int8_float_io", rows)
    model, rec = xnnpack_int8.whole_on_xnnpack(
        fm, int8, lambda scopes: quantize(fm, "static_int8_float_io", rows, keep_float=scopes), rows[0])
    assert rec["int8"]["partitions"] > 1
    base = xnnpack_plan(fm)
    assert rec["int8_with_float_ops"]["partitions"] == base["partitions"]  # split no further than float32
    assert rec["int8_with_float_ops"]["left"] == base["left"]
    faster = min(("int8", "int8_with_float_ops"), key=lambda k: rec[f"{k}_ms"])
    assert rec["chosen"] == faster and (model is int8) == (faster == "int8")
    # a conv net: every int8 op runs on XNNPACK, nothing is kept float and nothing is timed
    cfm, crows = _float_and_rows(_CNN(), (1, 3, 12, 12))
    cint8 = quantize(cfm, "static_int8_float_io", crows)
    same, crec = xnnpack_int8.whole_on_xnnpack(cfm, cint8, lambda s: pytest.fail("nothing to keep"), crows[0])
    assert same is cint8 and crec["chosen"] == "int8" and crec["int8"]["partitions"] == 1


def test_the_accuracy_aware_rounds_variants_are_made_whole_on_xnnpack_too(block):
    # a range repair (min/max) or layers kept float for accuracy: the same choice as the first variant's
    fm, rows = block
    kind = ModuleKind.from_loaded(load_object(_Block().eval(), (torch.randn(1, 8, 16),)), ConvertOptions(samples=2),
                                  np.random.default_rng(0))
    kind.calib = rows
    art = kind.variant_keeping_float(Artifact(model=fm, precision="float32"), "static_int8_float_io", [], "min_max")
    note = next(n for n in kind.notes if n.startswith("static_int8_float_io: XNNPACK has no int8 kernel for"))
    parts, base = xnnpack_plan(art.model)["partitions"], xnnpack_plan(fm)["partitions"]
    assert (parts == base) if note.endswith("kept in float32 (precision/xnnpack_int8.py)") else (parts > base), note
    # and it is min/max's variant, not the default ranges' (the ranges differ, so the bytes do)
    assert art.model != kind.variant_keeping_float(Artifact(model=fm, precision="float32"), "static_int8_float_io",
                                                   []).model


@pytest.mark.slow
def test_android_measures_static_int8_with_calibration_rows_only(tmp_path):
    torch.manual_seed(0)
    net, x = _CNN().eval(), (torch.randn(1, 3, 12, 12),)
    rows = [(torch.randn(1, 3, 12, 12),) for _ in range(24)]
    r = tc.convert(net, x, targets="android", out=tmp_path / "a", calibration=rows, samples=8, refine_rounds=0)
    android = r["android"]
    cands = {c["precision"]: c for c in android.candidates}
    assert set(cands) == {"float16", "dynamic_int8", "static_int8_float_io"}
    assert all(c["xnnpack_partitions"] == 1 and c["ops_outside_xnnpack"] == {} for c in cands.values()), cands
    assert android.xnnpack["partitions"] == 1 and android.to_json()["xnnpack"]["ops"] > 0
    html = (tmp_path / "a" / "report.html").read_text()
    assert f"XNNPACK: 1 partition(s), {android.xnnpack['ops']} of {android.xnnpack['ops']} ops" in html
    # chosen by the rule: the first listed that passes, unless a later one is >= 10% faster
    passed = [c for c in android.candidates if c["passed"]]
    assert cands[android.precision]["chosen"] and cands[android.precision] in passed
    # without calibration rows it is not a candidate, and the report says why
    r = tc.convert(net, x, targets="android", out=tmp_path / "b", samples=4, latency=False, refine_rounds=0)
    assert {c["precision"] for c in r["android"].candidates} == {"float16", "dynamic_int8"}
    assert any("static_int8_float_io not measured" in n for n in r.report["notes"])


def test_dynamic_int8_depthwise_convs_left_outside_xnnpack_are_kept_float_when_faster():
    torch.manual_seed(0)
    dw = nn.Sequential(nn.Conv2d(3, 16, 1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.ReLU(),
                       nn.Conv2d(16, 8, 1), nn.Flatten(), nn.Linear(8 * 12 * 12, 4))
    fm, rows = _float_and_rows(dw, (1, 3, 12, 12))
    dyn = quantize(fm, "dynamic_int8")
    plan = xnnpack_plan(dyn)
    assert plan["left"] == {"DEPTHWISE_CONV_2D": 1} and plan["partitions"] == 2, plan  # XNNPACK: no hybrid depthwise
    model, rec = xnnpack_int8.whole_on_xnnpack(fm, dyn, lambda s: quantize(fm, "dynamic_int8", keep_float=s), rows[0])
    assert rec["int8_with_float_ops"]["left"] == {} and rec["int8_with_float_ops"]["partitions"] == 1
    faster = min(("int8", "int8_with_float_ops"), key=lambda k: rec[f"{k}_ms"])
    assert rec["chosen"] == faster and (model is dyn) == (faster == "int8")


class _LSTMClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm, self.head = nn.LSTM(8, 16, batch_first=True), nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.lstm(x)[0][:, -1])


def test_an_artifact_slower_than_pytorch_names_the_ops_outside_xnnpack(tmp_path):
    from tpu_pipeline.convert.pipeline import _why_slower

    torch.manual_seed(0)
    r = tc.convert(_LSTMClassifier().eval(), (torch.randn(1, 20, 8),), targets="desktop", out=tmp_path, samples=4)
    desktop = r["desktop"]
    # the sequence LSTM and the one-step LSTM that resets its state
    assert desktop.xnnpack["left"] == {"UNIDIRECTIONAL_SEQUENCE_LSTM": 2}, desktop.xnnpack
    lat = desktop.latency_ms
    # whichever side of PyTorch this box measured, the note is there exactly when the artifact is slower
    assert ("slower_than_torch" in lat) == (lat["speedup_vs_torch"] < 1), lat
    for speedup, said in ((0.5, True), (2.0, False)):
        desktop.latency_ms = {"artifact": 1.0, "torch_eager": speedup, "speedup_vs_torch": speedup}
        _why_slower(desktop)
        note = desktop.latency_ms.get("slower_than_torch")
        assert (note is not None) == said
        if said:
            assert note.startswith("2.00x PyTorch eager's time") and "UNIDIRECTIONAL_SEQUENCE_LSTM x2" in note, note
