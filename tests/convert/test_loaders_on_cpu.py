"""Every MODEL form the loader takes or refuses, without running a conversion."""

from __future__ import annotations

import json
import zipfile

import pytest
import torch
from click.testing import CliRunner

from tpu_pipeline.cli import cli
from tpu_pipeline.convert import load_model, load_profiles
from tpu_pipeline.convert.module.loaders import parse_input_shape
from tpu_pipeline.convert.targets import resolve_targets
from tpu_pipeline.convert.tflite_info import inspect_model
from tpu_pipeline.errors import ConversionError, UserError
from tpu_pipeline.testing import reference_models as R
from tpu_pipeline.testing.model_files import RM, Touch, hf_llama, manifest


def test_manifest_needs_no_flags(tmp_path):
    m = load_model(manifest("DepthwiseCNN", tmp_path / "model.pt"))
    assert m.source_format.startswith("tpu-pipeline")
    assert [tuple(a.shape) for a in m.sample_args] == [(1, 1, 8, 8)]
    assert m.input_names == ["x"] and m.output_names == ["logits"] and m.task == "classification"


def test_manifest_outside_tpu_pipeline_needs_model_class(tmp_path):
    p = manifest("DepthwiseCNN", tmp_path / "model.pt")
    obj = torch.load(p, weights_only=True)
    obj["model_class"] = "os:system"
    torch.save(obj, p)
    with pytest.raises(UserError, match="--model-class"):
        load_model(p)


def test_bf16_weights_are_cast_and_noted(tmp_path):
    m = load_model(manifest("DepthwiseCNN", tmp_path / "model.pt", dtype=torch.bfloat16))
    assert all(p.dtype == torch.float32 for p in m.module.parameters())
    assert any("bfloat16" in n and "float32" in n for n in m.notes)


@pytest.mark.parametrize("device", ["tpu:0", "cuda:0"])
def test_accelerator_saved_tensors_load_on_cpu(tmp_path, device):
    """A checkpoint whose storages are tagged for a device this machine lacks."""
    reg = torch.serialization._package_registry
    entry = (0, lambda obj: device, lambda obj, loc: None)
    reg.insert(0, entry)
    try:
        p = manifest("DepthwiseCNN", tmp_path / "model.pt")
    finally:
        reg.remove(entry)
    with zipfile.ZipFile(p) as z:  # the file really names the device
        assert any(device.encode() in z.read(n) for n in z.namelist() if n.endswith("data.pkl"))
    m = load_model(p)
    assert next(m.module.parameters()).device.type == "cpu"


def test_state_dict_with_model_class_and_kwargs(tmp_path):
    sd = R.DepthwiseCNN(width=8).state_dict()
    torch.save(sd, tmp_path / "w.pt")
    with pytest.raises(UserError, match="--model-class"):
        load_model(tmp_path / "w.pt")
    m = load_model(tmp_path / "w.pt", model_class=f"{RM}:DepthwiseCNN", model_kwargs='{"width": 8}')
    assert m.module.head.in_features == 8
    with pytest.raises(UserError, match="do not fit"):
        load_model(tmp_path / "w.pt", model_class=f"{RM}:DepthwiseCNN")


def test_model_class_from_working_directory(tmp_path, monkeypatch):
    (tmp_path / "mynet.py").write_text(
        "import torch\nclass Net(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__(); self.fc = torch.nn.Linear(4, 2)\n"
        "    def forward(self, x):\n        return self.fc(x)\n")
    monkeypatch.chdir(tmp_path)
    torch.nn.Linear(4, 2)
    torch.save({"fc.weight": torch.randn(2, 4), "fc.bias": torch.zeros(2)}, tmp_path / "w.pt")
    m = load_model(tmp_path / "w.pt", model_class="mynet:Net", input_shapes=["1,4"])
    assert tuple(m.sample_args[0].shape) == (1, 4)


@pytest.mark.parametrize("name", ["m.pt2", "m.pt"])  # a .pt holding an export archive is sniffed, not guessed
def test_export_archive_with_example_inputs(tmp_path, name):
    ep = torch.export.export(R.DepthwiseCNN().eval(), (torch.randn(1, 1, 8, 8),))
    torch.export.save(ep, tmp_path / name)
    m = load_model(tmp_path / name)
    assert m.source_format == "torch.export archive" and tuple(m.sample_args[0].shape) == (1, 1, 8, 8)
    with pytest.raises(UserError, match=r"does not run on inputs \[2, 1, 8, 8\]"):  # exported with static shapes
        load_model(tmp_path / name, input_shapes=["2,1,8,8"])


def test_pickled_module_needs_trust_pickle(tmp_path):
    torch.save(R.DepthwiseCNN(), tmp_path / "whole.pt")
    with pytest.raises(UserError, match="--trust-pickle"):
        load_model(tmp_path / "whole.pt")
    m = load_model(tmp_path / "whole.pt", trust_pickle=True)
    assert isinstance(m.module, R.DepthwiseCNN)


def test_malicious_pickle_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"state_dict": Touch(str(marker))}, tmp_path / "evil.pt")
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["convert", str(tmp_path / "evil.pt"), "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert "--trust-pickle" in r.output and "Traceback" not in r.output
    assert not marker.exists() and not out.exists()


def test_torchscript_says_how_to_reexport(tmp_path):
    torch.jit.script(R.DepthwiseCNN().eval()).save(str(tmp_path / "ts.pt"))
    with pytest.raises(UserError, match="torch.export.save"):
        load_model(tmp_path / "ts.pt")


def test_hf_causal_lm_folder(tmp_path):
    m = load_model(hf_llama(tmp_path / "hf"))
    assert m.task == "causal-lm" and m.sample_args[0].dtype == torch.int64
    logits = m.module(*m.sample_args)
    assert tuple(logits.shape) == (1, 16, 32)


@pytest.mark.parametrize("content,why", [(b"", "empty"), (b"not a model at all\n" * 10, "not a PyTorch"),
                                         ("truncate", "truncated")])
def test_bad_files_one_line_exit_2_nothing_written(tmp_path, content, why):
    p = tmp_path / "bad.pt"
    if content == "truncate":
        manifest("DepthwiseCNN", p)
        data = p.read_bytes()
        p.write_bytes(data[: len(data) // 2])
    else:
        p.write_bytes(content)
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["convert", str(p), "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert why in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 2  # the load progress line, then the one error line
    assert not out.exists() and list(tmp_path.iterdir()) == [p]


def test_wrong_shape_is_bad_input(tmp_path):
    p = manifest("DepthwiseCNN", tmp_path / "model.pt")
    r = CliRunner().invoke(cli, ["convert", str(p), "--input-shape", "1,3,5", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "does not run on inputs [1, 3, 5]" in r.output
    assert not (tmp_path / "o").exists()


def test_input_shape_parsing():
    assert parse_input_shape("1,3,224,224") == ((1, 3, 224, 224), torch.float32)
    assert parse_input_shape("1,16:int64") == ((1, 16), torch.int64)
    for bad in ("1,x", "1,3:complex", "0,3", ""):
        with pytest.raises(UserError):
            parse_input_shape(bad)


def test_target_profiles_are_data():
    profiles = load_profiles()
    assert profiles.names() == ["android", "android-npu", "desktop", "ios", "iot", "web"]
    iot = profiles.get("iot")
    assert iot.precision == "static_int8" and iot.runtime == "tflite-micro" and "CONV_2D" in iot.allowed_ops
    # android-npu opts out of `all` (in_all = false: it needs the [npu] extra); named, it is there
    assert [p.name for p in resolve_targets("all", profiles)] == ["android", "ios", "desktop", "web", "iot"]
    assert [p.name for p in resolve_targets("android-npu,android", profiles)] == ["android", "android-npu"]
    with pytest.raises(UserError, match="valid: android, android-npu, desktop, ios, iot, web"):
        resolve_targets("android,phone", profiles)


def test_targets_are_ordered_by_their_files_order_field(tmp_path):
    from tpu_pipeline.convert.targets import profile_dir

    for f in profile_dir().glob("*.toml"):
        text = f.read_text()
        if f.stem == "iot":
            assert "\norder = 50 " in text
            text = text.replace("\norder = 50 ", "\norder = 5 ")
        (tmp_path / f.name).write_text(text)
    profiles = load_profiles(tmp_path)
    assert [e.name for e in profiles.entries()] == ["iot", "android", "android-npu", "ios", "desktop", "web"]
    assert [p.name for p in resolve_targets("web,iot,desktop", profiles)] == ["iot", "desktop", "web"]


def test_every_profile_field_is_commented():
    from tpu_pipeline.convert.targets import profile_dir

    for f in profile_dir().glob("*.toml"):
        for line in f.read_text().splitlines():
            if "=" in line and not line.startswith("#"):
                assert "#" in line, f"{f.name}: {line}"


def test_manifest_calibration_inputs_feed_calibration_and_held_out_parity(tmp_path):
    import numpy as np

    from tpu_pipeline.convert.module.kind import _parity_samples, _rows

    p = manifest("DepthwiseCNN", tmp_path / "model.pt")
    obj = torch.load(p, weights_only=True)
    obj["calibration_inputs"] = [torch.arange(20 * 64, dtype=torch.float32).reshape(20, 1, 8, 8)]
    torch.save(obj, p)
    m = load_model(p)
    rows = _rows(m.calibration, m)
    samples, source, calib = _parity_samples(m, None, rows, "manifest", 8, np.random.default_rng(0))
    assert len(samples) == 8 and len(calib) == 12 and "held out" in source
    # drawn with the seed's rng (--seed redraws them), none of them calibrated on
    firsts = {float(r[0][0, 0, 0, 0]) for r in samples}
    assert len(firsts) == 8 and not firsts & {float(r[0][0, 0, 0, 0]) for r in calib}
    again, _, _ = _parity_samples(m, None, rows, "manifest", 8, np.random.default_rng(1))
    assert {float(r[0][0, 0, 0, 0]) for r in again} != firsts
    obj["calibration_inputs"] = [torch.zeros(4, 1, 7, 7)]
    torch.save(obj, p)
    with pytest.raises(UserError, match="calibration_inputs"):
        load_model(p)


def test_an_artifact_the_interpreter_refuses_is_a_conversion_error():
    """A variant LiteRT cannot load (seen: static int8 of ConvNeXt) fails its target with
    exit 3 instead of ending the whole call with an unexpected ValueError."""
    with pytest.raises(ConversionError, match="does not load in the LiteRT interpreter"):
        inspect_model(b"0" * 64)
