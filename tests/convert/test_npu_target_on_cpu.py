"""The android-npu target end to end (convert/npu/, convert/targets/android-npu.toml): compiled per
SoC by LiteRT, each compiled model run on Qualcomm's HTP simulator, in the same call as android;
and its one-line refusals (no [npu] extra, a SoC that cannot compile here, too little on the NPU)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import tpu_pipeline.convert as tc
from tpu_pipeline.convert.targets import profile_dir
from tpu_pipeline.errors import EXIT_BAD_INPUT, EXIT_CONVERSION

try:
    import onnxruntime_qnn  # noqa: F401
    NO_EXTRA = None
except ImportError:
    NO_EXTRA = "the [npu] extra is not installed"
needs_extra = pytest.mark.skipif(NO_EXTRA is not None, reason=str(NO_EXTRA))


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(),
                                            torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU())
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


class WithAtan2(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.angle = torch.nn.Identity()
        self.out = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.out(torch.relu(torch.atan2(self.fc(x), x + 1.0)))


class GeluMLP(torch.nn.Module):
    """Linear -> GELU -> Linear: iot's static int8 (GELU as a CAST+GATHER table) matches PyTorch on
    XNNPACK (cosine 0.998), but its compiled HTP bytecode does not (cosine about -0.1 on the simulator,
    LiteRT 2.3 + QNN 2.51); android-npu's static_int8_float_io keeps GELU an op and passes."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        self.out = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.out(torch.nn.functional.gelu(self.fc(x)))


def _net(cls):
    torch.manual_seed(0)
    return cls().eval()


@needs_extra
def test_android_and_android_npu_in_one_call(tmp_path):
    net = _net(SmallCNN)
    calib = [(torch.randn(1, 1, 8, 8),) for _ in range(32)]
    res = tc.convert(net, (torch.randn(1, 1, 8, 8),), targets="android,android-npu", out=tmp_path / "out",
                     calibration=calib, samples=16, latency=False)
    assert res["android"].passed, res["android"].reasons
    t = res["android-npu"]
    assert t.passed, t.reasons
    assert t.quantization == "static_int8_float_io"  # preferred, and it passed on XNNPACK and the simulator
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    npu = report["targets"]["android-npu"]["npu"]
    assert npu["qnn_version"].startswith("2.51") and set(npu["socs"]) == {"SM8650", "SM8750"}
    compiled = {}
    for soc, f in npu["socs"].items():
        assert f["ops_on_npu"] == f["ops_total"] >= 5 and f["partitions"] == 1 and f["cpu_ops"]["by_op"] == {}
        sim = f["simulator"]
        assert sim["ran"] and sim["passed"] and sim["rows"] == 16 and not sim["stitched"]
        # the exact bytecode on the simulator: within one int8 step of XNNPACK, and close to PyTorch
        assert max(v["max_lsb"] for v in sim["vs_xnnpack"].values()) <= 1.001
        assert min(m["cosine_mean"] for m in sim["vs_pytorch"].values()) > 0.98
        d = tmp_path / "out" / "android-npu" / soc
        compiled[soc] = (d / "model.tflite").read_bytes()
        assert f["artifact"] == str(d / "model.tflite") and len(compiled[soc]) == f["size_bytes"]
        meta = json.loads((d / "model.json").read_text())
        assert meta["soc"] == soc and meta["npu"]["ops_on_npu"] == f["ops_on_npu"] and meta["quantization"] == "static_int8_float_io"
    assert compiled["SM8650"] != compiled["SM8750"]
    assert b"DISPATCH_OP" in compiled["SM8650"] and b"DISPATCH_OP" not in (
        tmp_path / "out" / "android-npu" / "model.tflite").read_bytes()  # the fallback: before the compile
    # Play's AI pack (LiteRT's exporter): each SoC's compiled model, the uncompiled one for other phones
    pack = tmp_path / "out" / "android-npu" / "ai_pack"
    assets = pack / "out" / "src" / "main" / "assets"  # the pack is named after the output folder
    for soc in ("SM8650", "SM8750"):
        assert (assets / f"model#group_Qualcomm_{soc}" / "model.tflite").read_bytes() == compiled[soc]
    assert (assets / "model#group_other" / "model.tflite").read_bytes() == (
        tmp_path / "out" / "android-npu" / "model.tflite").read_bytes()
    targeting = (pack / "device_targeting_configuration.xml").read_text()
    assert 'model="SM8650"' in targeting and 'model="SM8750"' in targeting
    assert npu["ai_pack"]["dir"] == str(pack)
    kt = (tmp_path / "out" / "android-npu" / "ModelRunner.kt").read_text()
    assert "Accelerator.NPU" in kt and "Accelerator.GPU" in kt and "BuiltinNpuAcceleratorProvider" in kt
    html = (tmp_path / "out" / "report.html").read_text()
    n = npu["socs"]["SM8650"]["ops_total"]
    assert f"SM8650: {n}/{n} ops on the NPU, 1 partition(s)" in html and "HTP simulator: pass on 16 rows" in html


@needs_extra
def test_a_model_the_npu_takes_only_partly_names_its_cpu_ops_and_min_share_refuses_it(tmp_path):
    profiles = tmp_path / "profiles"
    shutil.copytree(profile_dir(), profiles)
    p = profiles / "android-npu.toml"
    text = p.read_text()
    assert 'npu_socs = ["SM8650", "SM8750"]' in text and "min_npu_ops_share = 0.0 " in text
    p.write_text(text.replace('npu_socs = ["SM8650", "SM8750"]', 'npu_socs = ["SM8650"]')
                 .replace("min_npu_ops_share = 0.0 ", "min_npu_ops_share = 0.95 "))
    net = _net(WithAtan2)
    calib = [(torch.randn(1, 8),) for _ in range(32)]
    res = tc.convert(net, (torch.randn(1, 8),), targets="android-npu", out=tmp_path / "out", calibration=calib,
                     samples=8, latency=False, profile_dir=str(profiles))
    t = res["android-npu"]
    assert not t.passed and t.failure == "compatibility" and res.exit_code == EXIT_CONVERSION
    assert any("under the profile's min_npu_ops_share 95%" in r and "ATAN2 x1" in r for r in t.reasons), t.reasons
    f = t.npu["socs"]["SM8650"]
    assert f["cpu_ops"]["by_op"] == {"ATAN2": 1} and f["ops_on_npu"] == f["ops_total"] - 1 and f["partitions"] == 2
    assert not (tmp_path / "out" / "android-npu" / "model.tflite").exists()  # only under failed/
    assert (tmp_path / "out" / "android-npu" / "failed" / "SM8650" / "model.tflite").exists()

    # the same model with the default share: stitched on the simulator end to end, and it ships
    p.write_text(text.replace('npu_socs = ["SM8650", "SM8750"]', 'npu_socs = ["SM8650"]'))
    res = tc.convert(net, (torch.randn(1, 8),), targets="android-npu", out=tmp_path / "out2", calibration=calib,
                     samples=8, latency=False, profile_dir=str(profiles))
    t = res["android-npu"]
    assert t.passed, t.reasons
    sim = t.npu["socs"]["SM8650"]["simulator"]
    assert sim["stitched"] and sim["segments"] == 3 and sim["passed"], sim
    # float output (dequantized on the NPU): within a few int8 steps of the output's range of XNNPACK
    assert max(v["max_abs"] for v in sim["vs_xnnpack"].values()) < 0.02, sim["vs_xnnpack"]
    assert min(m["cosine_mean"] for m in sim["vs_pytorch"].values()) > 0.98, sim["vs_pytorch"]


@needs_extra
def test_int8_that_passes_on_xnnpack_but_not_on_the_npu_falls_back_to_float16(tmp_path):
    profiles = tmp_path / "profiles"
    shutil.copytree(profile_dir(), profiles)
    p = profiles / "android-npu.toml"
    text = p.read_text()
    assert 'precisions = ["static_int8_float_io", "float16"]' in text
    # iot's static int8, whose GELU table the HTP gets wrong: an int8 that passes on XNNPACK only
    p.write_text(text.replace('npu_socs = ["SM8650", "SM8750"]', 'npu_socs = ["SM8650"]')
                 .replace('precisions = ["static_int8_float_io", "float16"]', 'precisions = ["static_int8", "float16"]'))
    net = _net(GeluMLP)
    calib = [(torch.randn(1, 8, 16),) for _ in range(32)]
    res = tc.convert(net, (torch.randn(1, 8, 16),), targets="android-npu", out=tmp_path / "out", calibration=calib,
                     samples=8, latency=False, profile_dir=str(profiles))
    t = res["android-npu"]
    assert t.passed and t.quantization == "float16", t.reasons
    first = t.npu["failed_first"]
    assert first["precision"] == "static_int8" and "on the HTP simulator" in first["reasons"][0]
    bad = first["socs"]["SM8650"]["simulator"]
    assert bad["ran"] and not bad["passed"] and min(m["cosine_mean"] for m in bad["vs_pytorch"].values()) < 0.5
    cands = {c["precision"]: c for c in t.candidates}
    assert not cands["static_int8"]["passed"] and cands["float16"]["chosen"]
    good = t.npu["socs"]["SM8650"]["simulator"]
    assert good["passed"] and min(m["cosine_mean"] for m in good["vs_pytorch"].values()) > 0.999
    assert "failed on the NPU" in t.chosen_because


@needs_extra
def test_the_default_int8_keeps_gelu_an_op_and_passes_on_the_npu(tmp_path):
    profiles = tmp_path / "profiles"
    shutil.copytree(profile_dir(), profiles)
    p = profiles / "android-npu.toml"
    p.write_text(p.read_text().replace('npu_socs = ["SM8650", "SM8750"]', 'npu_socs = ["SM8650"]')
                 .replace('precisions = ["static_int8_float_io", "float16"]', 'precisions = ["static_int8_float_io"]'))
    calib = [(torch.randn(1, 8, 16),) for _ in range(32)]
    res = tc.convert(_net(GeluMLP), (torch.randn(1, 8, 16),), targets="android-npu", out=tmp_path / "out",
                     calibration=calib, samples=8, latency=False, profile_dir=str(profiles))
    t = res["android-npu"]
    assert t.passed and t.quantization == "static_int8_float_io", t.reasons
    f = t.npu["socs"]["SM8650"]
    assert f["ops_on_npu"] == f["ops_total"] and f["partitions"] == 1, f
    assert min(m["cosine_mean"] for m in f["simulator"]["vs_pytorch"].values()) > 0.98, f["simulator"]


@needs_extra
def test_with_labels_the_simulator_is_judged_against_the_cpu_run_whose_task_score_decides(tmp_path):
    import numpy as np

    profiles = tmp_path / "profiles"
    shutil.copytree(profile_dir(), profiles)
    p = profiles / "android-npu.toml"
    p.write_text(p.read_text().replace('npu_socs = ["SM8650", "SM8750"]', 'npu_socs = ["SM8650"]'))
    net = _net(SmallCNN)
    x = torch.randn(24, 1, 8, 8)
    with torch.no_grad():
        labels = net(x).argmax(1).numpy()
    np.savez(tmp_path / "eval.npz", arr_0=x.numpy(), labels=labels)
    res = tc.convert(net, (x[:1],), targets="android-npu", out=tmp_path / "out", eval_data=str(tmp_path / "eval.npz"),
                     calibration=[(torch.randn(1, 1, 8, 8),) for _ in range(32)], latency=False,
                     profile_dir=str(profiles))
    t = res["android-npu"]
    assert t.passed, t.reasons
    assert "task_score" in t.metrics  # the CPU run's task score decided the variant
    sim = t.npu["socs"]["SM8650"]["simulator"]
    assert sim["judged_against"].startswith("the CPU run") and sim["passed"] and sim["rows"] == 16
    assert min(m["cosine_mean"] for m in sim["vs_pytorch"].values()) > 0.98  # figures against PyTorch beside it


@needs_extra
def test_shape_buckets_compile_per_bucket_and_soc_each_run_on_the_simulator(tmp_path):
    net = _net(SmallCNN)  # its global mean pool takes any resolution: rows of each bucket's exact shape
    res = tc.convert(net, (torch.randn(1, 1, 8, 8),), targets="android-npu", out=tmp_path / "out",
                     shapes=("x=1x1x8x8,1x1x16x16",), pad=("x=none",), samples=8, latency=False)
    t = res["android-npu"]
    assert t.passed, t.errors
    names = ["x_1x1x8x8", "x_1x1x16x16"]
    assert [b["name"] for b in t.buckets] == names and {b["quantization"] for b in t.buckets} == {t.quantization}
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    npu = report["targets"]["android-npu"]["npu"]
    assert npu["qnn_version"].startswith("2.51") and list(npu["buckets"]) == names
    d = tmp_path / "out" / "android-npu"
    compiled = {}
    for name in names:
        for soc, f in npu["buckets"][name]["socs"].items():
            assert f["ops_on_npu"] == f["ops_total"] and f["simulator"]["ran"] and f["simulator"]["passed"]
            assert f["simulator"]["rows"] == 8 and min(m["cosine_mean"] for m in f["simulator"]["vs_pytorch"].values()) > 0.98
            compiled[soc, name] = (d / soc / f"model_{name}.tflite").read_bytes()
            assert f["artifact"] == str(d / soc / f"model_{name}.tflite") and b"DISPATCH_OP" in compiled[soc, name]
    assert set(compiled) == {(soc, n) for soc in ("SM8650", "SM8750") for n in names}
    assert compiled["SM8650", names[0]] != compiled["SM8650", names[1]]  # each bucket its own fixed-shape compile
    for soc in ("SM8650", "SM8750"):
        meta = json.loads((d / soc / "model.json").read_text())
        assert meta["soc"] == soc and meta["shapes"]["layout"] == "files"
        assert [(e["name"], e["file"], e["inputs"]["x"]) for e in meta["shapes"]["signatures"]] == [
            (names[0], f"model_{names[0]}.tflite", [1, 1, 8, 8]), (names[1], f"model_{names[1]}.tflite", [1, 1, 16, 16])]
        assert all(e["npu"]["simulator"]["passed"] for e in meta["shapes"]["signatures"])
        assert meta["size_bytes"] == sum(len(compiled[soc, n]) for n in names)  # the compiled files, not the fallback
    # the uncompiled fallback, a file per bucket like any files layout
    assert json.loads((d / "model.json").read_text())["shapes"]["layout"] == "files"
    assert all((d / f"model_{n}.tflite").is_file() for n in names)
    html = (tmp_path / "out" / "report.html").read_text()
    assert f"SM8750, bucket {names[1]}: " in html and "HTP simulator: pass on 8 rows" in html
    # Play's AI pack: each SoC's group holds every bucket's compile, the "other" group the uncompiled files
    assets = d / "ai_pack" / "out" / "src" / "main" / "assets"
    for n in names:
        for soc in ("SM8650", "SM8750"):
            assert (assets / f"model#group_Qualcomm_{soc}" / f"model_{n}.tflite").read_bytes() == compiled[soc, n]
        assert (assets / "model#group_other" / f"model_{n}.tflite").read_bytes() == (d / f"model_{n}.tflite").read_bytes()
    assert npu["ai_pack"]["dir"] == str(d / "ai_pack") and len(npu["ai_pack"]["files"]) == 7  # 6 models, the xml
    # the app picks the bucket's file (an image at its exact size) and opens it on the NPU, then the GPU, the CPU
    kt = (d / "BucketRunner.kt").read_text()
    assert f'Bucket("model_{names[0]}.tflite", 64),\n        Bucket("model_{names[1]}.tflite", 256)' in kt
    assert "it.length == input.size" in kt and "listOf(Accelerator.NPU, Accelerator.GPU)" in kt
    assert "BuiltinNpuAcceleratorProvider(context)" in kt and "CompiledModel.create(assets, b.name" in kt
    assert json.loads((d / "model.json").read_text())["app_snippet"] == str(d / "BucketRunner.kt")


def _cli(args, tmp_path, env_extra=None):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "tpu_pipeline", "convert", *args], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)


def test_without_the_extra_android_npu_fails_in_one_line_naming_it(tmp_path):
    from tpu_pipeline.testing.model_files import manifest

    model = manifest("DepthwiseCNN", tmp_path / "model.pt")
    hide = tmp_path / "hide"
    hide.mkdir()
    # a module that fails to import, first on the path: as if onnxruntime-qnn were not installed
    (hide / "onnxruntime_qnn.py").write_text("raise ImportError('not installed')\n")
    p = _cli([str(model), "--targets", "android-npu", "--out", str(tmp_path / "out")], tmp_path,
             {"PYTHONPATH": str(hide)})
    assert p.returncode == EXIT_BAD_INPUT, p.stderr
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "pip install 'tpu-pipeline[npu]'" in lines[0] and "Traceback" not in p.stderr
    assert not (tmp_path / "out").exists()  # refused before anything was written


@needs_extra
def test_cli_json_stays_json_and_the_table_says_what_the_npu_took(tmp_path):
    """The HTP simulator prints a notice on fd 1 when it loads; --json's stdout must hold the report only."""
    from tpu_pipeline.testing.model_files import manifest

    model = manifest("DepthwiseCNN", tmp_path / "model.pt")
    profiles = tmp_path / "profiles"
    shutil.copytree(profile_dir(), profiles)
    p = profiles / "android-npu.toml"
    p.write_text(p.read_text().replace('npu_socs = ["SM8650", "SM8750"]', 'npu_socs = ["SM8750"]'))
    args = [str(model), "--targets", "android-npu", "--profile-dir", str(profiles), "--samples", "8", "--no-latency"]
    r = _cli([*args, "--out", str(tmp_path / "a"), "--json"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    f = json.loads(r.stdout)["targets"]["android-npu"]["npu"]["socs"]["SM8750"]
    assert f["ops_on_npu"] == f["ops_total"] and f["simulator"]["passed"]
    r = _cli([*args, "--out", str(tmp_path / "b")], tmp_path)
    n = f["ops_total"]
    assert r.returncode == 0 and f"android-npu: SM8750: {n}/{n} ops on the NPU, 1 partition(s); HTP simulator pass " \
        "on 8 rows" in r.stdout, r.stdout


def test_a_soc_that_cannot_compile_here_is_refused_in_one_line(tmp_path):
    from tpu_pipeline.testing.model_files import manifest

    model = manifest("DepthwiseCNN", tmp_path / "model.pt")
    profiles = tmp_path / "profiles"
    shutil.copytree(profile_dir(), profiles)
    p = profiles / "android-npu.toml"
    p.write_text(p.read_text().replace('npu_socs = ["SM8650", "SM8750"]', 'npu_socs = ["SM8650", "MT6989"]'))
    r = _cli([str(model), "--targets", "android-npu", "--profile-dir", str(profiles), "--out", str(tmp_path / "out")],
             tmp_path)
    assert r.returncode == EXIT_BAD_INPUT, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "MT6989 (MediaTek) cannot be compiled here" in lines[0]
    assert not (tmp_path / "out").exists()
