"""Inputs of more than one shape (convert/shapes.py): a signature per shape bucket, the
weights stored once, every bucket checked on each target's runtime against PyTorch on the
unpadded rows, and a model that padding changes refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from ai_edge_litert.tools import flatbuffer_utils
from click.testing import CliRunner

import tpu_pipeline.convert as tc
from tpu_pipeline.cli import cli
from tpu_pipeline.convert.module import bucket_snippets
from tpu_pipeline.convert.module.buckets import run_signature
from tpu_pipeline.convert.result import TargetResult
from tpu_pipeline.convert.shapes import _lengths, _one_precision, parse_buckets, parse_pad
from tpu_pipeline.convert.targets import load_profiles
from tpu_pipeline.errors import EXIT_BAD_INPUT, EXIT_PARITY, UserError
from tpu_pipeline.testing.model_files import manifest
from tpu_pipeline.testing.shape_models import GRUKeyword, MaskedTextCNN, MeanTextCNN, TwoResolutionCNN
from tpu_pipeline.testing.web_app import run_app_module

pytestmark = pytest.mark.slow


def _weight_bytes(model: bytes) -> int:
    obj = flatbuffer_utils.read_model_from_bytearray(bytearray(model))
    return sum(len(b.data) for b in obj.buffers if b.data is not None)


def test_dynamic_range_buckets_in_powers_of_two_and_bad_specs_refused():
    assert _lengths("16000..64000", "x:1=16000..64000") == [16384, 32768, 64000]
    assert _lengths("16,48", "x:1=16,48") == [16, 48]
    b = parse_buckets((), ("x:1=16000..64000",), ["x"], [(1, 16000)])
    assert [s.shapes for s in b] == [((1, 16384),), ((1, 32768),), ((1, 64000),)]
    assert [s.name for s in b] == ["x_1x16384", "x_1x32768", "x_1x64000"]
    pads = parse_pad((), ["x"], b)
    assert (pads["x"].rule, pads["x"].axis) == ("zeros", 1)
    bad = {("x=1x16000,1xA",): "is not a shape",
           ("y=1x16000",): "the model has no input 'y' (inputs: x)",
           ("x=1x16000x3",): "has 3 dimensions; input x has 2",
           ("x=1x16000,1x16000",): "is listed twice",
           ("x=1x0",): "must be a positive integer"}
    for spec, why in bad.items():
        with pytest.raises(UserError, match=why.replace("(", r"\(").replace(")", r"\)")):
            parse_buckets(spec, (), ["x"], [(1, 16000)])
    with pytest.raises(UserError, match="low end 64000 is above its high end 16000"):
        parse_buckets((), ("x:1=64000..16000",), ["x"], [(1, 16000)])
    with pytest.raises(UserError, match="expected NAME=zeros"):
        parse_pad(("x=reflect",), ["x"], b)


def test_bad_shapes_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    model = manifest("DepthwiseCNN", tmp_path / "model.pt")
    r = CliRunner().invoke(cli, ["convert", str(model), "--targets", "desktop", "--out", str(tmp_path / "out"),
                                 "--shapes", "x=1x1x8xE"])
    assert r.exit_code == EXIT_BAD_INPUT
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert lines[-1] == ("Error: --shapes 'x=1x1x8xE': '1x1x8xE' is not a shape; write dimensions joined by x, "
                         "like 1x16000"), r.output
    assert "Traceback" not in r.output
    assert not (tmp_path / "out").exists()
    r = CliRunner().invoke(cli, ["convert", str(model), "--targets", "desktop", "--out", str(tmp_path / "out"),
                                 "--pad", "x=zeros"])
    assert r.exit_code == EXIT_BAD_INPUT and "give the buckets with --shapes or --dynamic" in r.output


def test_one_precision_over_all_buckets():
    prof = load_profiles().get("android")  # float16 preferred, then dynamic_int8

    def res(q, passed, others=()):
        r = TargetResult(target="android", quantization=q, runtime="x", passed=passed)
        r.candidates = [{"precision": p, "passed": ok} for p, ok in others]
        return r

    # bucket 1 ships float16, bucket 2 only passes with dynamic_int8: dynamic_int8 for both
    rs = [res("float16", True, [("float16", True), ("dynamic_int8", True)]),
          res("dynamic_int8", True, [("float16", False), ("dynamic_int8", True)])]
    assert _one_precision(prof, rs) == "dynamic_int8"
    rs = [res("dynamic_int8", True, [("float16", True), ("dynamic_int8", True)]),
          res("float16", True, [("float16", True), ("dynamic_int8", True)])]
    assert _one_precision(prof, rs) == "float16"  # both pass both: the profile's first


def _rows_folder(path, lengths, seed=0):
    """A samples folder of unpadded rows of several lengths (ids and a mask of ones), labelled."""
    rng = np.random.default_rng(seed)
    path.mkdir()
    lines = []
    for k, n in enumerate(lengths):
        np.savez(path / f"row{k:02d}.npz", ids=rng.integers(0, 1000, (1, n)), mask=np.ones((1, n), np.float32))
        lines.append(f"row{k:02d}.npz,{k % 4}")
    (path / "labels.csv").write_text("\n".join(lines) + "\n")
    return path


def test_masked_text_cnn_buckets_as_signatures_and_files_each_checked(tmp_path):
    torch.manual_seed(0)
    net = MaskedTextCNN().eval()
    lengths = [9, 16, 16, 12, 20, 32, 32, 25]  # four rows to each bucket, two of them padded
    ev = _rows_folder(tmp_path / "rows", lengths)
    res = tc.convert(net, net.example_inputs(16), targets="desktop,web,iot", out=tmp_path / "out",
                     shapes=("ids=1x16,1x32", "mask=1x16,1x32"), pad=("ids=mask:mask",), eval_data=str(ev),
                     latency=False)
    assert res.passed, {n: t.errors for n, t in res.targets.items()}
    desk, iot = res["desktop"], res["iot"]
    assert [b["name"] for b in desk.buckets] == ["ids_1x16_mask_1x16", "ids_1x32_mask_1x32"]
    # per bucket, on the target's runtime, against PyTorch on the unpadded rows: float32 is exact
    for b in desk.buckets:
        assert b["passed"] and b["quantization"] == "float32"
        assert b["parity"]["cosine"] > 0.999999 and b["parity"]["max_abs"] < 1e-5
        assert b["parity"]["task_score"]["rows"] == 4
    for b in iot.buckets:  # TFLM, full int8: looser, but still close
        assert b["passed"] and b["quantization"] == "static_int8" and b["parity"]["cosine_mean"] > 0.99
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert {k: v["padded_rows"] for k, v in report["shapes"]["padding_check"].items()} == {
        "ids_1x16_mask_1x16": 2, "ids_1x32_mask_1x32": 2}
    assert all(v["max_rel"] < 1e-5 for v in report["shapes"]["padding_check"].values())
    gate = report["float_export"]  # the float32 export judged per bucket, as desktop
    assert gate["passed"] and gate["judged_as"] == "desktop"
    assert {k: (v["passed"], v["cosine"] > 0.999999) for k, v in gate["buckets"].items()} == {
        "ids_1x16_mask_1x16": (True, True), "ids_1x32_mask_1x32": (True, True)}
    page = (tmp_path / "out" / "report.html").read_text()
    assert "bucket ids_1x32_mask_1x32 passes (float32, cosine 1" in page
    assert "one file, a signature per bucket, rerun by name on ai-edge-litert, litert.js: matches" in page

    # desktop: one file, a signature per bucket, weights stored once
    mj = json.loads((tmp_path / "out" / "desktop" / "model.json").read_text())
    assert mj["shapes"]["layout"] == "signatures"
    assert [(s["name"], s["signature"], s["inputs"]["ids"]) for s in mj["shapes"]["signatures"]] == [
        ("ids_1x16_mask_1x16", "ids_1x16_mask_1x16", [1, 16]), ("ids_1x32_mask_1x32", "ids_1x32_mask_1x32", [1, 32])]
    assert mj["shapes"]["padding"]["ids"]["rule"] == "mask" and mj["shapes"]["padding"]["ids"]["companion"] == "mask"
    model = (tmp_path / "out" / "desktop" / "model.tflite").read_bytes()
    single = tc.convert(net, net.example_inputs(32), targets="desktop", out=tmp_path / "one", samples=4,
                        latency=False)["desktop"].artifact.model
    assert len(single) == desk.buckets[1]["size_bytes"]
    assert _weight_bytes(model) <= 1.001 * _weight_bytes(single)  # weights once, not twice
    assert len(model) < 1.05 * len(single)  # the second signature adds only its graph
    # batch 4 by resize_tensor_input: the text CNN's RESHAPE to a constant shape refuses it (said, not shipped)
    assert all(not b["batch_resize"]["works"] and "RESHAPE" in b["batch_resize"]["why"] for b in desk.buckets)
    check = desk.parity["signature_file"]
    assert check["passed"] and all(v["output_0"]["ai-edge-litert"]["max_abs_vs_bucket_file"] == 0.0
                                   for v in check["signatures"].values())
    # the shipped file run by signature name gives PyTorch's answer on an unpadded row of 12 tokens
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 1000, (1, 12))
    want = net(torch.from_numpy(ids), torch.ones(1, 12)).detach().numpy()
    padded = [np.pad(ids, ((0, 0), (0, 4))).astype(np.int32), np.pad(np.ones((1, 12), np.float32), ((0, 0), (0, 4)))]
    got = run_signature(model, "ids_1x16_mask_1x16", [padded])[0][0]
    assert np.abs(got - want).max() < 1e-5

    # web: the same one file, each signature run by name in LiteRT.js (headless Chromium) against PyTorch
    web = res["web"]
    mj_web = json.loads((tmp_path / "out" / "web" / "model.json").read_text())
    assert mj_web["shapes"]["layout"] == "signatures" and (tmp_path / "out" / "web" / "model.tflite").is_file()
    for name, per in web.parity["signature_file"]["signatures"].items():
        js = per["output_0"]["litert.js"]
        assert js["cosine"] > 0.9999 and js["max_abs_vs_bucket_file"] < 1e-3, (name, js)
    runner = (tmp_path / "out" / "web" / "bucket_runner.js").read_text()
    assert '{"signature": "ids_1x16_mask_1x16", "length": 16, "shape": [1, 16]}' in runner
    assert "x.length >= input.length" in runner and "model.run(b.signature, {" in runner
    # ... and it runs, as a web app would load it: unpadded ids of any length up to 32, the mask made by
    # the runner, the answer PyTorch's on the same unpadded ids; 33 ids is refused
    rng = np.random.default_rng(2)
    rows = [rng.integers(0, 1000, n).tolist() for n in (5, 16, 17, 32)]
    got = run_app_module(tmp_path / "out" / "web", "bucket_runner.js",
                         [("runBucketed", [("Int32Array", r)]) for r in rows] + [("runBucketed", [("Int32Array", [1] * 33)])])
    for r, g in zip(rows, got):
        want = net(torch.tensor([r]), torch.ones(1, len(r))).detach().numpy().ravel()
        assert g["ok"], g
        out = np.array(next(iter(g["outputs"].values())))
        assert out.shape == want.shape and np.abs(out - want).max() < 1e-3 * max(1.0, np.abs(want).max()), (len(r), out, want)
    assert not got[-1]["ok"] and "no bucket takes an input of 33 values" in got[-1]["error"]

    # iot: one file per bucket (TFLM runs one subgraph), each with its firmware files and arena
    mj = json.loads((tmp_path / "out" / "iot" / "model.json").read_text())
    assert mj["shapes"]["layout"] == "files"
    arenas = []
    for s in mj["shapes"]["signatures"]:
        assert (tmp_path / "out" / "iot" / s["file"]).is_file()
        fw = s["firmware"]
        assert fw["files"] == [f"model_data_{s['name']}.h", f"model_data_{s['name']}.cc"]
        header = (tmp_path / "out" / "iot" / fw["files"][0]).read_text()
        assert f"g_model_{s['name']}_tensor_arena_size = {fw['tensor_arena_size']}" in header
        arenas.append(fw["arena_used_bytes"])
    assert 0 < arenas[0] < arenas[1]  # the longer bucket needs the larger arena
    # the firmware helper picks the smallest bucket that holds n ids, in one arena sized for the largest
    runner = (tmp_path / "out" / "iot" / "bucket_runner.h").read_text()
    sizes = [s["firmware"]["tensor_arena_size"] for s in mj["shapes"]["signatures"]]
    assert f"alignas(16) static uint8_t g_arena[{max(sizes)}];" in runner
    assert ("{g_model_ids_1x16_mask_1x16_data, 16, g_model_ids_1x16_mask_1x16_tensor_arena_size},\n"
            "    {g_model_ids_1x32_mask_1x32_data, 32, g_model_ids_1x32_mask_1x32_tensor_arena_size}") in runner
    # the int8 mask is written in the bucket's own scale, not as a raw 1
    assert "p[i] = Q(i < n ? 1 : 0, interp.input(1));" in runner


def test_a_model_that_padding_changes_is_refused_with_the_padding_message(tmp_path):
    torch.manual_seed(0)
    net = MeanTextCNN().eval()
    res = tc.convert(net, net.example_inputs(16), targets="desktop", out=tmp_path / "out",
                     dynamic=("ids:1=12..32",), samples=6, latency=False)
    t = res["desktop"]
    assert not t.passed and res.exit_code == EXIT_PARITY
    assert [b["name"] for b in t.buckets] == ["ids_1x16", "ids_1x32"]
    assert t.errors[0].startswith("bucket ids_1x16 failed: padding changes the output: in bucket ids_1x16, PyTorch "
                                  "on 3 padded rows departs from PyTorch on the same rows unpadded")
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["shapes"]["padding_check"]["ids_1x16"]["cosine_min"] < 0.999
    assert report["float_export"] is None  # both buckets refused in PyTorch: no export was made to judge
    # nothing ships: no artifact outside failed/
    assert not (tmp_path / "out" / "desktop" / "model.tflite").exists()
    assert not list((tmp_path / "out" / "desktop").glob("*.tflite"))


def test_two_resolutions_exact_rows_and_batch_by_resize(tmp_path):
    torch.manual_seed(0)
    net = TwoResolutionCNN().eval()
    res = tc.convert(net, net.example_inputs(), targets="desktop,web", out=tmp_path / "out",
                     shapes=("x=1x3x32x32,1x3x48x64",), pad=("x=none",), samples=4, latency=False)
    t = res["desktop"]
    assert t.passed, t.errors
    assert [b["name"] for b in t.buckets] == ["x_1x3x32x32", "x_1x3x48x64"]
    assert all(b["parity"]["cosine"] > 0.999999 for b in t.buckets)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert all(v["padded_rows"] == 0 for v in report["shapes"]["padding_check"].values())  # rule none: exact rows
    # a conv net's graph follows a new batch: 4 rows batched equal the 4 rows alone
    for b in t.buckets:
        assert b["batch_resize"]["works"] and b["batch_resize"]["batch"] == 4 and b["batch_resize"]["max_abs"] < 1e-5
    mj = json.loads((tmp_path / "out" / "desktop" / "model.json").read_text())
    assert [s["io"]["inputs"][0]["shape"] for s in mj["shapes"]["signatures"]] == [[1, 3, 32, 32], [1, 3, 48, 64]]
    assert all(s["batch_resize"]["works"] for s in mj["shapes"]["signatures"])
    # the app files take an image at a bucket's exact size (3x32x32 = 3072 values, 3x48x64 = 9216), never padded
    apps = tmp_path / "apps"
    apps.mkdir()
    for language in ("kotlin", "swift", "js", "cpp"):
        bucket_snippets.write(language, {**mj, "target": "android"}, apps, "two_res")
    kt, swift = (apps / "BucketRunner.kt").read_text(), (apps / "BucketRunner.swift").read_text()
    js, cpp = (apps / "bucket_runner.js").read_text(), (apps / "bucket_runner.h").read_text()
    assert 'Bucket("x_1x3x32x32", 3072),\n        Bucket("x_1x3x48x64", 9216)' in kt and "it.length == input.size" in kt
    assert "inputs[0].writeFloat(FloatArray(b.length).also { input.copyInto(it) })" in kt
    assert '("x_1x3x32x32", 3072), ("x_1x3x48x64", 9216)' in swift and "$0.length == input.count" in swift
    assert '{"signature": "x_1x3x48x64", "length": 9216, "shape": [1, 3, 48, 64]}' in js
    assert "x.length === input.length" in js and "padded(input, b.length, Float32Array), b.shape)" in js
    assert "if (c.length == n)" in cpp
    # the web runner, run as an app loads it: each image at its bucket, PyTorch's answer; 3x40x40 refused
    assert res["web"].passed, res["web"].errors
    images = [torch.randn(1, 3, 32, 32), torch.randn(1, 3, 48, 64)]
    got = run_app_module(tmp_path / "out" / "web", "bucket_runner.js",
                         [("runBucketed", [("Float32Array", x.ravel().tolist())]) for x in images]
                         + [("runBucketed", [("Float32Array", [0.0] * 4800)])])
    for x, g in zip(images, got):
        want = net(x).detach().numpy().ravel()
        assert g["ok"], g
        assert np.abs(np.array(next(iter(g["outputs"].values()))) - want).max() < 1e-2 * np.abs(want).max()
    assert not got[-1]["ok"] and "no bucket takes an input of 4800 values" in got[-1]["error"]


def test_manifest_lists_its_buckets_and_the_cli_converts_them(tmp_path):
    from tpu_pipeline.train.manifest import write_model

    torch.manual_seed(0)
    net = TwoResolutionCNN().eval()
    write_model(tmp_path / "model.pt", model_class="tpu_pipeline.testing.shape_models:TwoResolutionCNN",
                model_kwargs={}, state_dict=net.state_dict(), example_inputs=net.example_inputs(),
                input_names=["image"], output_names=["logits"], task="classification", recipe="test", metrics={},
                shape_buckets={"shapes": ["image=1x3x32x32,1x3x40x40"], "pad": ["image=none"]})
    r = CliRunner().invoke(cli, ["convert", str(tmp_path / "model.pt"), "--targets", "desktop", "--out",
                                 str(tmp_path / "out"), "--samples", "4", "--no-latency"])
    assert r.exit_code == 0, r.output
    assert "desktop: bucket image_1x3x40x40: ok float32 cos(min) 1.000000" in r.output
    mj = json.loads((tmp_path / "out" / "desktop" / "model.json").read_text())
    assert [s["name"] for s in mj["shapes"]["signatures"]] == ["image_1x3x32x32", "image_1x3x40x40"]
    assert mj["shapes"]["padding"]["image"]["rule"] == "none"


def test_gru_keyword_model_with_a_length_input_on_xnnpack_and_tflm(tmp_path):
    torch.manual_seed(0)
    net = GRUKeyword().eval()
    res = tc.convert(net, net.example_inputs(2048), targets="desktop,iot", out=tmp_path / "out",
                     dynamic=("audio:1=2000..4096",), pad=("audio=length:length",), samples=4, latency=False)
    assert res.passed, {n: t.errors for n, t in res.targets.items()}
    assert [b["name"] for b in res["desktop"].buckets] == ["audio_1x2048", "audio_1x4096"]
    assert all(b["parity"]["cosine"] > 0.999999 for b in res["desktop"].buckets)
    assert all(b["parity"]["cosine_mean"] > 0.99 and b["quantization"] == "static_int8" for b in res["iot"].buckets)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    # half the rows are shorter than their bucket; the length input keeps the answer exactly
    assert all(v["padded_rows"] == 2 and v["max_rel"] < 1e-5 for v in report["shapes"]["padding_check"].values())
    mj = json.loads((tmp_path / "out" / "iot" / "model.json").read_text())
    assert mj["shapes"]["padding"]["audio"] == {**mj["shapes"]["padding"]["audio"], "rule": "length",
                                                "companion": "length", "axis": 1}
    runner = (tmp_path / "out" / "iot" / "bucket_runner.h").read_text()
    assert "interp.input(1)->data.i32[0] = n;" in runner  # the length input takes the real length


def test_a_profile_that_drops_failing_buckets_ships_the_rest_and_names_the_one_left_out(tmp_path):
    from tpu_pipeline.convert.targets import profile_dir

    prof = tmp_path / "profiles"
    prof.mkdir()
    text = (profile_dir() / "desktop.toml").read_text()
    (prof / "desktop.toml").write_text(text + 'bucket_failure = "drop"  # ship the buckets that pass\n')
    rows = tmp_path / "rows"
    rows.mkdir()
    rng = np.random.default_rng(0)
    for k, n in enumerate([16, 16, 16, 20, 25, 32]):  # bucket 16: exact rows; bucket 32: two padded
        np.save(rows / f"row{k}.npy", rng.integers(0, 1000, (1, n)))
    torch.manual_seed(0)
    net = MeanTextCNN().eval()  # its mean reads the padding
    res = tc.convert(net, net.example_inputs(16), targets="desktop", out=tmp_path / "out", profile_dir=str(prof),
                     shapes=("ids=1x16,1x32",), eval_data=str(rows), latency=False)
    t = res["desktop"]
    assert t.passed and res.exit_code == 0
    assert [(b["name"], b["passed"]) for b in t.buckets] == [("ids_1x16", True), ("ids_1x32", False)]
    assert any(w.startswith("bucket ids_1x32 failed: padding changes the output") and w.endswith(
        "(shipped without it: the profile's bucket_failure is drop)") for w in t.warnings)
    model = (tmp_path / "out" / "desktop" / "model.tflite").read_bytes()
    from ai_edge_litert.interpreter import Interpreter
    assert list(Interpreter(model_content=model).get_signature_list()) == ["ids_1x16"]
    mj = json.loads((tmp_path / "out" / "desktop" / "model.json").read_text())
    assert [(s["name"], s["passed"], s.get("signature")) for s in mj["shapes"]["signatures"]] == [
        ("ids_1x16", True, "ids_1x16"), ("ids_1x32", False, None)]


def test_static_int8_signature_file_calibrates_every_signature(tmp_path):
    """Full-integer on ai-edge-litert (a copy of the iot profile run on XNNPACK): one file, its
    int8 ranges calibrated over every bucket's rows in one pass, each signature with its own scales."""
    from tpu_pipeline.convert.targets import profile_dir

    prof = tmp_path / "profiles"
    prof.mkdir()
    text = (profile_dir() / "iot.toml").read_text()
    text = text.replace('runtime = "tflite-micro"', 'runtime = "ai-edge-litert"').replace(
        "firmware = true", "firmware = false")
    (prof / "int8cpu.toml").write_text(text)
    torch.manual_seed(0)
    net = TwoResolutionCNN().eval()
    res = tc.convert(net, net.example_inputs(), targets="int8cpu", out=tmp_path / "out", profile_dir=str(prof),
                     shapes=("x=1x3x32x32,1x3x48x48",), pad=("x=none",), samples=8, latency=False)
    t = res["int8cpu"]
    assert t.passed, t.errors
    assert t.quantization == "static_int8" and all(b["quantization"] == "static_int8" for b in t.buckets)
    sig = t.parity["signature_file"]
    assert sig["passed"] and all(v["output_0"]["ai-edge-litert"]["cosine_mean"] > 0.99
                                 for v in sig["signatures"].values())
    mj = json.loads((tmp_path / "out" / "int8cpu" / "model.json").read_text())
    assert mj["shapes"]["layout"] == "signatures"
    ins = [s["io"]["inputs"][0] for s in mj["shapes"]["signatures"]]
    assert [i["dtype"] for i in ins] == ["int8", "int8"] and all(i["quantization"]["scale"] > 0 for i in ins)
