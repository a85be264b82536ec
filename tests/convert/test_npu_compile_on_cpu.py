"""android-npu's pieces on the real tools (no mocks): LiteRT's AOT compile with Qualcomm's QNN
libraries from onnxruntime-qnn, and the compiled bytecode on Qualcomm's x86 HTP simulator. Needs
the [npu] extra (`make install` installs it); without it these tests skip and
test_npu_target_on_cpu.py checks the one-line refusal."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from tpu_pipeline.convert.npu import qnn_libs
from tpu_pipeline.errors import ConversionError, UserError

pytest.importorskip("onnxruntime_qnn", reason="the [npu] extra is not installed")

from tpu_pipeline.convert.npu.check import check  # noqa: E402
from tpu_pipeline.convert.npu.compile import check_socs, compile_for, read_compiled  # noqa: E402
from tpu_pipeline.convert.npu.simulator import HtpSimulator  # noqa: E402
from tpu_pipeline.convert.runtimes.litert import LitertRunner  # noqa: E402
from tpu_pipeline.convert.tflite_info import inspect_model  # noqa: E402


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).mean((2, 3)))


class WithAtan2(torch.nn.Module):
    """atan2 has no HTP kernel: the NPU takes the layers around it, the CPU keeps it."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.out(torch.relu(torch.atan2(self.fc(x), x + 1.0)))


class CpuAtTheEdges(torch.nn.Module):
    """Two inputs, two outputs; ATAN2 on the CPU first and last, the NPU in between."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x, y):
        h = torch.relu(self.fc(torch.atan2(x, y)))
        return torch.atan2(h, y + 2.0), h * 2


def _tflite(net, shape, tmp, int8: bool) -> bytes:
    import litert_torch

    from tpu_pipeline.convert.precision.quantize import quantize

    torch.manual_seed(0)
    path = tmp / f"{type(net).__name__}.tflite"
    litert_torch.convert(net.eval(), (torch.randn(shape),)).export(str(path))
    model = path.read_bytes()
    if int8:
        rng = np.random.default_rng(1)
        model = quantize(model, "static_int8", [{"args_0": rng.standard_normal(shape).astype(np.float32)}
                                                for _ in range(16)])
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("npu")
    torch.manual_seed(0)
    return {"conv_int8": (_tflite(ConvNet(), (1, 3, 16, 16), tmp, True), (1, 3, 16, 16)),
            "conv_f32": (_tflite(ConvNet(), (1, 3, 16, 16), tmp, False), (1, 3, 16, 16)),
            "atan2_int8": (_tflite(WithAtan2(), (1, 8), tmp, True), (1, 8))}


@pytest.fixture(scope="module")
def libs():
    return qnn_libs.require()


def _rows(shape, n=4, seed=0):
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(shape).astype(np.float32)] for _ in range(n)]


def test_libraries_are_linked_not_copied_into_a_folder_the_project_owns(libs):
    import onnxruntime_qnn

    src = qnn_libs.Path(onnxruntime_qnn.LIB_DIR_FULL_PATH).resolve()
    assert str(libs.lib_dir).startswith(str(qnn_libs.cache_root()))
    htp = libs.lib_dir / "libQnnHtp.so"
    assert htp.is_symlink() and htp.resolve() == src / "libQnnHtp.so"
    assert libs.qnn_version.startswith("2.51")
    # nothing was added to onnxruntime-qnn's folder
    assert not (src / "libQnnLpai.so").exists()


@pytest.mark.parametrize("precision", ["conv_int8", "conv_f32"])
def test_fully_offloaded_model_runs_on_the_simulator_like_xnnpack(models, libs, precision):
    model, shape = models[precision]
    compiled = {soc: compile_for(model, soc, libs) for soc in ("SM8650", "SM8750")}
    for c in compiled.values():
        assert (c.ops_on_npu, c.ops_total, len(c.partitions), c.cpu_ops) == (c.ops_total, c.ops_total, 1, [])
        assert c.ops_total >= 4
    # v75 and v79 HTP bytecode: one artifact per SoC, not one copied
    assert compiled["SM8650"].model != compiled["SM8750"].model
    info = inspect_model(model)
    cpu = LitertRunner(model, info)
    sim = HtpSimulator(compiled["SM8650"].model)
    rows = _rows(shape)
    got = [sim.run(r)[0] for r in rows]
    ref = [cpu.run(r)[0] for r in rows]
    err = max(float(np.abs(g - r).max()) for g, r in zip(got, ref))
    scale = info.outputs[0].scale
    if scale:  # int8 output: within one quantization step of XNNPACK
        assert err <= scale * 1.001, (err, scale)
    else:  # float32 runs in float16 on the HTP
        assert 0 < err < 2e-3, err


def test_partly_offloaded_model_is_stitched_and_names_what_stays_on_the_cpu(models, libs):
    model, shape = models["atan2_int8"]
    c = compile_for(model, "SM8650", libs)
    assert [o["op"] for o in c.cpu_ops] == ["ATAN2"]
    assert len(c.partitions) == 2 and c.ops_on_npu == c.ops_total - 1
    stats = c.stats()
    assert stats["cpu_ops"]["by_op"] == {"ATAN2": 1} and 0.8 < stats["npu_ops_share"] < 1.0
    sim = HtpSimulator(c.model)
    assert [s.partition.name if s.partition else "cpu" for s in sim.segments] == [
        "qnn_partition_0", "cpu", "qnn_partition_1"]
    info = inspect_model(model)
    cpu = LitertRunner(model, info)
    for r in _rows(shape):
        assert np.abs(sim.run(r)[0] - cpu.run(r)[0]).max() <= info.outputs[0].scale * 1.001


def test_cpu_ops_first_and_last_and_several_inputs_and_outputs_are_stitched(tmp_path, libs):
    import litert_torch

    torch.manual_seed(0)
    net = CpuAtTheEdges().eval()
    litert_torch.convert(net, (torch.randn(1, 8), torch.randn(1, 8))).export(str(tmp_path / "m.tflite"))
    model = (tmp_path / "m.tflite").read_bytes()
    c = compile_for(model, "SM8650", libs)
    assert c.stats()["cpu_ops"]["by_op"] == {"ATAN2": 2} and len(c.partitions) == 2
    info = inspect_model(model)
    sim = HtpSimulator(c.model, [t.name for t in info.inputs], [t.name for t in info.outputs])
    kinds = ["cpu" if s.partition is None else "npu" for s in sim.segments]
    assert kinds[0] == "cpu" and kinds[-1] == "cpu" and kinds.count("npu") == 2
    cpu = LitertRunner(model, info)
    for r in _rows((1, 8), 3):
        r = r + [np.random.default_rng(1).standard_normal((1, 8)).astype(np.float32)]
        got, ref = sim.run(r), cpu.run(r)
        assert len(got) == 2 and all(np.abs(g - f).max() < 5e-3 for g, f in zip(got, ref))  # fp16 on the HTP
    with pytest.raises(ConversionError, match="outputs .* are not the model's"):
        HtpSimulator(c.model, None, ["no_such_output", "other"])


def test_damaged_bytecode_is_refused_not_run(models, libs):
    c = compile_for(models["conv_int8"][0], "SM8650", libs)
    p = c.partitions[0]
    bad = bytearray(c.model)
    bad[p.bytecode_offset:p.bytecode_offset + 256] = bytes(256)
    with pytest.raises(ConversionError, match="HTP simulator refused qnn_partition_0"):
        HtpSimulator(bytes(bad))
    with pytest.raises(ConversionError, match="lies outside"):
        read_compiled(c.model[:p.bytecode_offset + 10])


def _judge_against(ref):
    def judge(got):
        err = max(float(np.abs(g[0] - r[0]).max()) for g, r in zip(got, ref))
        return {"output_0": {"max_abs": err}}, err < 0.05, [] if err < 0.05 else [f"max_abs {err:.3g}"]
    return judge


def test_check_refuses_below_min_share_and_judges_the_simulator(models):
    model, shape = models["atan2_int8"]
    rows = _rows(shape, 3)
    cpu = LitertRunner(model, inspect_model(model))
    cpu_got = [cpu.run(r) for r in rows]
    res = check("android-npu", ["SM8650"], 0.95, 0, model, rows, _judge_against(cpu_got), cpu_got, lambda _m: None)
    assert not res.passed and res.failure == "compatibility"
    assert "under the profile's min_npu_ops_share 95%" in res.reasons[0] and "ATAN2 x1" in res.reasons[0]
    assert "simulator" not in res.figures["socs"]["SM8650"]  # refused before it ran
    res = check("android-npu", ["SM8650"], 0.5, 2, model, rows, _judge_against(cpu_got), cpu_got, lambda _m: None)
    assert res.passed, res.reasons
    sim = res.figures["socs"]["SM8650"]["simulator"]
    assert sim["rows"] == 2 and sim["stitched"] and sim["passed"]
    assert max(v["max_lsb"] for v in sim["vs_xnnpack"].values()) <= 1.001
    # the same rows against a reference they do not match: a parity failure, not a pass
    wrong = [[y + 1.0 for y in row] for row in cpu_got]
    res = check("android-npu", ["SM8650"], 0.5, 2, model, rows, _judge_against(wrong), cpu_got, lambda _m: None)
    assert not res.passed and res.failure == "parity" and res.reasons[0].startswith("SM8650: on the HTP simulator")


@pytest.mark.parametrize("soc, why", [("MT6989", "MediaTek"), ("Tensor_G4", "Google Tensor"),
                                      ("SM9999", "unknown SoC")])
def test_socs_that_cannot_compile_here_are_refused_in_one_line(soc, why):
    with pytest.raises(UserError, match=why) as e:
        check_socs(["SM8650", soc], "target android-npu")
    assert "\n" not in str(e.value)


def test_without_the_extra_the_refusal_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime_qnn", None)  # import fails as if not installed
    with pytest.raises(UserError, match=r"pip install 'tpu-pipeline\[npu\]'") as e:
        qnn_libs.require()
    assert "\n" not in str(e.value)


def test_a_qnn_sdk_of_ones_own_is_used_as_it_is_and_checked(tmp_path, monkeypatch, libs):
    monkeypatch.setenv(qnn_libs.SDK_ENV, str(tmp_path))
    with pytest.raises(UserError, match="libQnnHtp.so, libQnnIr.so, libQnnSaver.so, libQnnSystem.so not found"):
        qnn_libs.require()
    monkeypatch.setenv(qnn_libs.SDK_ENV, str(libs.lib_dir))
    assert qnn_libs.require().lib_dir == libs.lib_dir


def test_an_unwritable_cache_falls_back_to_the_temporary_folder(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")  # no folder can be made under a file, whoever runs the test (root too)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file" / "cache"))
    monkeypatch.setattr(qnn_libs.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    got = qnn_libs.require().lib_dir
    assert str(got).startswith(str(tmp_path / "tmp")) and (got / "libQnnHtp.so").is_symlink()
