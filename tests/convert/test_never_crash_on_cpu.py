"""Never crash (issue 19, item 6): a runtime, check or localization that raises becomes the
target's failure with its reason, or a documented fallback; bad files and data are one line
and exit 2; the Python API raises only tpu_pipeline.errors types."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from tpu_pipeline.cli import cli
import tpu_pipeline.convert as tc
from tpu_pipeline.convert import load_model
from tpu_pipeline.convert.module.kind import ModuleKind
from tpu_pipeline.convert.runtimes.litert import BUILTIN_KERNELS, LitertRunner
from tpu_pipeline.errors import ConversionError, PipelineError, UserError
from tpu_pipeline.testing.model_files import manifest


class ReflectPad1d(torch.nn.Module):
    """A voice-activity-detector-like front end: reflect-padded Conv1d over audio frames. The
    converter lowers the 1-D reflect pad with an int32 ABS v5, which the reference kernels lack."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(1, 4, 5)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.conv(F.pad(x, (2, 2), mode="reflect")).mean(-1))


class ReflectPad2d(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3)

    def forward(self, x):
        return self.conv(F.pad(x, (1, 1, 1, 1), mode="reflect")).mean((2, 3))


def _pad1d():
    torch.manual_seed(0)
    return ReflectPad1d().eval(), (torch.randn(1, 1, 64),)


FALLBACK = "the reference kernels lack ABS v5"


def test_reflect_pad_1d_python_api_falls_back_and_says_so(tmp_path):
    model, args = _pad1d()
    r = tc.convert(model, args, targets="desktop", out=tmp_path / "out", latency=False, samples=4)
    assert r.passed, r.targets["desktop"].errors
    noise = r.targets["desktop"].parity["kernel_noise"]
    assert noise["reference"] == BUILTIN_KERNELS and FALLBACK in noise["fallback"]
    assert noise["max_abs_xnnpack_vs_reference"] < 1e-5  # two real kernel sets agree on it
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert any(n.startswith("kernel-noise check: " + FALLBACK) for n in report["notes"])
    assert FALLBACK in (tmp_path / "out" / "report.html").read_text()


def test_reflect_pad_1d_cli_exits_0_with_report(tmp_path):
    model, args = _pad1d()
    pt2 = tmp_path / "vad.pt2"
    torch.export.save(torch.export.export(model, args), pt2)
    res = CliRunner().invoke(cli, ["convert", str(pt2), "--targets", "desktop", "--out", str(tmp_path / "o"),
                                   "--no-latency", "--samples", "4"])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["passed"] and any(FALLBACK in n for n in report["notes"])


def test_reflect_pad_2d_runs_on_the_reference_kernels(tmp_path):
    """The 2-D reflect pad lowers to MIRROR_PAD, which the reference kernels have: no fallback."""
    torch.manual_seed(0)
    r = tc.convert(ReflectPad2d().eval(), (torch.randn(1, 1, 8, 8),), targets="desktop", out=tmp_path / "o",
                   latency=False, samples=4)
    assert r.passed
    noise = r.targets["desktop"].parity["kernel_noise"]
    assert noise["reference"].startswith("reference kernels") and "fallback" not in noise


def test_runner_refusing_an_artifact_is_a_conversion_error():
    from tpu_pipeline.convert.tflite_info import ModelInfo

    with pytest.raises(ConversionError, match="ai-edge-litert cannot load the artifact"):
        LitertRunner(b"TFL3" + bytes(60), ModelInfo(inputs=[], outputs=[], ops=[], tensors={}))


# --- a runtime, check or localization that raises: fault injection into the real pipeline -------------

def _small():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 4)).eval(), (torch.randn(1, 8),)


def test_runtime_crash_in_one_target_fails_that_target_only(tmp_path, monkeypatch):
    real = ModuleKind.parity

    def crashing(self, prof, *a, **kw):
        if prof.name == "android":
            raise RuntimeError("invoke() failed: planted")
        return real(self, prof, *a, **kw)

    monkeypatch.setattr(ModuleKind, "parity", crashing)
    model, args = _small()
    r = tc.convert(model, args, targets="desktop,android", out=tmp_path / "o", latency=False, samples=4)
    assert r.targets["desktop"].passed
    a = r.targets["android"]
    assert not a.passed and a.failure == "conversion"
    assert any("RuntimeError: invoke() failed: planted" in e for e in a.errors), a.errors
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["exit_code"] == 3 and not report["targets"]["android"]["passed"]


def test_runtime_crash_everywhere_is_exit_3_with_a_report(tmp_path, monkeypatch):
    def crashing(self, sample):
        raise RuntimeError("planted interpreter crash")

    monkeypatch.setattr(LitertRunner, "run", crashing)
    model, args = _small()
    pt2 = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(model, args), pt2)
    res = CliRunner().invoke(cli, ["convert", str(pt2), "--targets", "desktop,android", "--out", str(tmp_path / "o"),
                                   "--no-latency", "--samples", "4"])
    assert res.exit_code == 3, res.output
    assert "Traceback" not in res.output and "unexpected" not in res.output
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    for t in report["targets"].values():
        assert not t["passed"] and any("planted interpreter crash" in e for e in t["errors"])


def test_localization_crash_keeps_the_parity_verdict(tmp_path, monkeypatch):
    from tpu_pipeline.testing.convert_models import PlantedMismatchCNN

    def crashing(self, art, info):
        raise IndexError("planted localization bug")

    monkeypatch.setattr(ModuleKind, "explain_failure", crashing)
    torch.manual_seed(0)
    net = PlantedMismatchCNN().eval()
    r = tc.convert(net, tuple(net.example_inputs()), targets="desktop", out=tmp_path / "o", latency=False,
                   samples=4)
    d = r.targets["desktop"]
    assert not d.passed and d.failure == "parity"  # the mismatch is still found and still fails
    planted = "localization failed: IndexError: planted localization bug"
    assert r.report["float_export"]["localize_failed"] == planted  # the float32 gate's own localization
    assert planted in d.warnings, d.warnings


def test_report_html_crash_still_writes_the_report(tmp_path, monkeypatch):
    from tpu_pipeline.convert import pipeline

    def crashing(report):
        raise KeyError("planted")

    monkeypatch.setattr(pipeline, "render_html", crashing)
    model, args = _small()
    r = tc.convert(model, args, targets="desktop", out=tmp_path / "o", latency=False, samples=4)
    assert r.passed
    assert "could not be rendered (KeyError" in (tmp_path / "o" / "report.html").read_text()
    assert any("report.html could not be rendered" in w
               for w in json.loads((tmp_path / "o" / "report.json").read_text())["warnings"])


def test_untyped_error_outside_the_targets_is_a_conversion_error(tmp_path, monkeypatch):
    def crashing(self, *a, **kw):
        raise KeyError("planted")

    monkeypatch.setattr(ModuleKind, "prepare", crashing)
    model, args = _small()
    with pytest.raises(ConversionError, match=r"internal error: KeyError: 'planted'") as e:
        tc.convert(model, args, targets="desktop", out=tmp_path / "o", latency=False, samples=4)
    assert isinstance(e.value.__cause__, KeyError)  # --debug shows the original traceback
    assert not (tmp_path / "o").exists()  # nothing half-written


def test_out_that_is_a_file_is_refused_and_left_alone(tmp_path):
    model, args = _small()
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    with pytest.raises(UserError, match="is a file, not a folder"):
        tc.convert(model, args, targets="desktop", out=f, latency=False)
    assert f.read_text() == "mine"


# --- loaders and data files: what the fuzzer found, one test each ---------------------------------------

def _manifest_with(tmp_path, **fields):
    p = manifest("DepthwiseCNN", tmp_path / "model.pt")
    m = torch.load(p, weights_only=True)
    m.update(fields)
    torch.save(m, p)
    return p


@pytest.mark.parametrize("cls", ["tpu_pipeline.__main__:main",          # importing it starts the CLI
                                 "tpu_pipeline.files:atomic_write_text"])  # calling it writes a file
def test_manifest_class_outside_the_model_modules_is_refused(tmp_path, cls):
    with pytest.raises(UserError, match="outside tpu_pipeline's model modules"):
        load_model(_manifest_with(tmp_path, model_class=cls, model_kwargs={"path": str(tmp_path / "x"), "text": ""}))
    assert not (tmp_path / "x").exists()


def test_manifest_class_that_is_not_a_module_is_never_called(tmp_path):
    with pytest.raises(UserError, match="not an nn.Module subclass"):
        load_model(_manifest_with(tmp_path, model_class="tpu_pipeline.testing.model_files:Touch",
                                  model_kwargs={"target": str(tmp_path / "touched")}))
    assert not (tmp_path / "touched").exists()


@pytest.mark.parametrize("field,value,match", [
    ("model_kwargs", [1, 2], "'model_kwargs' must be an object"),
    ("state_dict", {"blocks.0.weight": "not a tensor"}, "must map parameter names to tensors"),
    ("state_dict", [torch.zeros(1)], "'state_dict' must be a dict"),
    ("example_inputs", [1.5], "'example_inputs' must hold tensors"),
    ("input_names", 7, "'input_names' must be a list of strings"),
    ("model_class", 3, "'model_class' must be a string"),
])
def test_manifest_fields_of_the_wrong_type_are_bad_input(tmp_path, field, value, match):
    with pytest.raises(UserError, match=match):
        load_model(_manifest_with(tmp_path, **{field: value}))


def test_model_class_constructor_errors_are_bad_input(tmp_path):
    torch.save(torch.nn.Linear(2, 2).state_dict(), tmp_path / "sd.pt")
    with pytest.raises(UserError, match=r"negative dimension"):
        load_model(tmp_path / "sd.pt", model_class="tpu_pipeline.testing.reference_models:DepthwiseCNN",
                   model_kwargs='{"width": -1}')  # nn.Conv2d raises a RuntimeError


def _npz_member(tmp_path, name, body: bytes):
    p = tmp_path / "rows.npz"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr(name, body)
    return p


def _rows_npy(arr) -> bytes:
    import io

    b = io.BytesIO()
    np.save(b, arr)
    return b.getvalue()


@pytest.mark.parametrize("make,match", [
    (lambda t: _npz_member(t, "x", b"not an npy array"), "is not a .npy array"),
    (lambda t: _npz_member(t, "x.npy", _rows_npy(np.zeros((4, 1, 8, 8), np.float32))[:-24]), "cannot be read"),
    (lambda t: _npz_member(t, "x.npy", _rows_npy(np.zeros((4, 1, 8, 8), np.complex64))), "holds complex64"),
    (lambda t: _npz_member(t, "x.npy", b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f4',   \n"), "cannot be read"),
])
@pytest.mark.parametrize("flag", ["calib", "eval_data"])
def test_damaged_npz_is_bad_input(tmp_path, make, match, flag):
    from tpu_pipeline.testing.reference_models import DepthwiseCNN

    torch.manual_seed(0)
    net = DepthwiseCNN().eval()
    with pytest.raises(UserError, match=match):
        tc.convert(net, tuple(net.example_inputs()), targets="desktop", out=tmp_path / "o", latency=False,
                   **{flag: make(tmp_path)})
    assert not (tmp_path / "o").exists()


def test_eval_rows_the_model_cannot_run_are_bad_input(tmp_path):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Flatten(), torch.nn.Linear(12, 2)).eval()
    np.savez(tmp_path / "ids.npz", ids=np.full((3, 3), 99, np.int64))  # beyond the 10-row table
    with pytest.raises(UserError, match="does not run on the parity rows from --eval-data"):
        tc.convert(net, (torch.zeros(1, 3, dtype=torch.int64),), targets="desktop", out=tmp_path / "o",
                   latency=False, eval_data=tmp_path / "ids.npz")


def test_the_api_raises_only_typed_errors_on_damaged_files(tmp_path):
    """Truncations of every seed form through the Python API: each a UserError, nothing written."""
    from tpu_pipeline.testing.fuzz_inputs import build_seeds

    seeds, _ = build_seeds(tmp_path / "seeds")
    for s in seeds.values():
        if s.npz_flag:
            continue
        for cut in (1, 7, len(s.data) // 2, len(s.data) - 1):
            p = tmp_path / f"{s.name}-{cut}{s.suffix}"
            p.write_bytes(s.data[:cut])
            with pytest.raises(PipelineError) as e:
                tc.convert(p, targets="desktop", out=tmp_path / "o", latency=False,
                           model_class=s.args[1] if s.args else None)
            assert type(e.value) is UserError, (s.name, cut, e.value)
            assert not (tmp_path / "o").exists()


def test_load_model_backstop_is_a_user_error(tmp_path, monkeypatch):
    """A failure no branch of the loader names (planted in the zip sniffing) is still one line."""
    import struct

    from tpu_pipeline.convert.module import loaders

    def crashing(path):
        raise struct.error("planted")

    monkeypatch.setattr(loaders, "_sniff", crashing)
    p = manifest("DepthwiseCNN", tmp_path / "model.pt")
    with pytest.raises(UserError, match=r"cannot load it \(error: planted\)") as e:
        load_model(p)
    assert isinstance(e.value.__cause__, struct.error)


def test_pt2_with_a_pickle_inside_never_runs_it(tmp_path, monkeypatch):
    """torch.export.load retries a member that fails its weights-only load with a full unpickle:
    without --trust-pickle that retry stays weights-only, so the file's code never runs."""
    from tpu_pipeline.testing.fuzz_inputs import PWNED, build_seeds

    build_seeds(tmp_path / "seeds")
    monkeypatch.chdir(tmp_path)  # the pickle writes PWNED into the cwd
    with pytest.raises(UserError, match="needs --trust-pickle"):
        load_model(tmp_path / "seeds" / "evil.pt2")
    assert not (tmp_path / PWNED).exists()
    res = CliRunner().invoke(cli, ["convert", str(tmp_path / "seeds" / "evil.pt2"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "Traceback" not in res.output and not (tmp_path / PWNED).exists()


def test_zip_end_record_naming_several_disks_is_bad_input(tmp_path):
    """zipfile.is_zipfile raises on this end record (found by bench/fuzz_convert.py)."""
    import io

    b = io.BytesIO()
    torch.save({"w": torch.zeros(2)}, b)
    data = bytearray(b.getvalue())
    loc = data.rfind(b"PK\x06\x07")  # torch writes zip64 records; the locator's disk count
    assert loc >= 0
    data[loc + 16:loc + 20] = (2).to_bytes(4, "little")  # 2 disks: a multi-disk archive
    (tmp_path / "m.pt").write_bytes(bytes(data))
    with pytest.raises(UserError, match="damaged zip archive") as e:
        load_model(tmp_path / "m.pt")
    assert "cannot load it" not in str(e.value)  # named, not the backstop
