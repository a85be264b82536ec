"""One pipeline for every model kind: options that do not apply to a kind are
refused in one line, a causal LM goes through the same compatibility checks,
tolerances and latency as a classifier, and a check that cannot run says so
(fail closed)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from tpu_pipeline.cli import cli
from tpu_pipeline.convert import load_profiles
from tpu_pipeline.convert.hf.kind import HFTaskKind
from tpu_pipeline.convert.kinds import MODEL_KINDS, detection_order, register_kind
from tpu_pipeline.convert.lm.kind import CausalLMKind
from tpu_pipeline.convert.module.kind import ModuleKind
from tpu_pipeline.convert.pipeline import model_kind
from tpu_pipeline.convert.tflite_info import inspect_model
from tpu_pipeline.convert.verdict import checks
from tpu_pipeline.testing.model_files import manifest, tiny_cnn_tflite


def run(*args):
    return CliRunner().invoke(cli, ["convert", *map(str, args)])


def _tiny_lm_folder(path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from tpu_pipeline.train.tasks.char_lm import build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                      eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # decisive argmax: random weights give near-uniform logits
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_kind_detection(tmp_path):
    assert model_kind(_tiny_lm_folder(tmp_path / "lm")) is CausalLMKind
    assert model_kind(manifest("DepthwiseCNN", tmp_path / "model.pt")) is ModuleKind


def test_kinds_register_where_defined_and_are_asked_in_detect_order():
    # registration order follows import order; detection must not
    assert detection_order() == [CausalLMKind, HFTaskKind, ModuleKind]
    assert sorted((e.name, e.obj.name, e.defined_in) for e in MODEL_KINDS.entries()) == [
        ("causal-lm", "causal-lm", "tpu_pipeline.convert.lm.kind"),
        ("hf-task", "hf-task", "tpu_pipeline.convert.hf.kind"),
        ("module", "module", "tpu_pipeline.convert.module.kind")]
    assert all(e.description for e in MODEL_KINDS.entries())
    with pytest.raises(ValueError, match="already registered"):
        register_kind("module")(type("Again", (ModuleKind,), {"__doc__": "a second module kind"}))


@pytest.mark.parametrize("flag, value, why", [
    ("--calib", "c.npz", "static int8 of a KV-cache LM is not built"),
    ("--eval-data", "e.npz", "pass --prompts FILE"),
    ("--input-shape", "1,8", "config.json and safetensors define the model"),
    ("--trust-pickle", None, "config.json and safetensors define the model"),
])
def test_lm_refuses_options_that_do_not_apply(tmp_path, flag, value, why):
    lm = _tiny_lm_folder(tmp_path / "lm")
    r = run(lm, flag, *([tmp_path / value] if value else []), "--out", tmp_path / "dist")
    assert r.exit_code == 2, r.output
    err = r.output.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"Error: {flag} ") and why in err[0]
    assert not (tmp_path / "dist").exists()


@pytest.mark.parametrize("flag, value", [("--prompts", "p.txt"), ("--max-len", "64"), ("--prefill-len", "8")])
def test_module_refuses_lm_only_options(tmp_path, flag, value):
    model = manifest("DepthwiseCNN", tmp_path / "model.pt")
    r = run(model, flag, value, "--out", tmp_path / "dist")
    assert r.exit_code == 2, r.output
    assert r.output.strip() == f"Error: {flag} applies to Hugging Face causal-LM folders with tokenizer.json only"
    assert not (tmp_path / "dist").exists()


@pytest.mark.slow
def test_lm_goes_through_checks_tolerances_and_latency(tmp_path):
    """--min-cosine now reaches an LM's parity (an impossible bound fails it, exit 4), the
    compatibility checks ran on its artifact, and latency is measured per generated token."""
    lm = _tiny_lm_folder(tmp_path / "lm")
    out = tmp_path / "dist"
    r = run(lm, "--targets", "desktop", "--samples", 2, "--max-len", 24, "--prefill-len", 8,
            "--min-cosine", 1.5, "--out", out)
    assert r.exit_code == 4, r.output
    report = json.loads((out / "report.json").read_text())
    assert report["kind"] == "causal-lm"
    t = report["targets"]["desktop"]
    assert t["failure"] == "parity" and t["parity"]["tolerances"]["min_cosine"] == 1.5
    assert t["parity"]["generation_agreement"] == 1.0  # tokens agree: only the override failed it
    assert any("cosine (worst sample)" in e and "< 1.5" in e for e in t["errors"])
    assert t["compatibility"]["passed"] and "FULLY_CONNECTED" in t["compatibility"]["ops"]
    lat = t["latency_ms"]
    assert lat["artifact"] > 0 and lat["torch_eager"] > 0 and lat["tokens"] >= 1 and "per generated token" in lat["unit"]
    assert set(t["timings_s"]) == {"quantize", "checks", "parity", "latency"}
    assert (out / "desktop" / "failed" / "lm.json").is_file() and not (out / "desktop" / "model.tflite").exists()


@pytest.fixture(scope="module")
def cnn_tflite(tmp_path_factory):
    _, path = tiny_cnn_tflite(tmp_path_factory.mktemp("chk") / "m.tflite")
    data = path.read_bytes()
    return data, inspect_model(data)


def test_analyzer_that_cannot_run_is_a_warning_and_not_done(cnn_tflite, monkeypatch):
    model, info = cnn_tflite
    android = load_profiles().get("android")
    assert android.delegate_check == "analyzer" and not android.require_delegate
    ok = checks.check(android, model, info)
    assert ok.delegate["checked"] is True and ok.not_checked == []
    assert ok.delegate["checked_by"] == "LiteRT model analyzer (gpu_compatibility)"

    class Broken:
        @staticmethod
        def ModelAnalyzer(*_args):
            raise RuntimeError("analyzer crashed")

    monkeypatch.setattr(checks, "analyzer", Broken)
    c = checks.check(android, model, info)
    assert c.passed  # a delegate the profile does not require: reported, not fatal
    assert c.delegate["checked"] is False and c.delegate["checked_by"] is None
    assert c.not_checked == ["gpu delegate coverage: model analyzer unavailable: RuntimeError: analyzer crashed"]
    assert c.warnings == ["WARNING: gpu delegate coverage was not checked (model analyzer unavailable: "
                          "RuntimeError: analyzer crashed)"]
    assert c.to_json()["not_checked"] == c.not_checked
    strict = checks.check(dataclasses.replace(android, require_delegate=True), model, info)
    assert not strict.passed and "android requires the delegate" in strict.violations[0]


@pytest.mark.slow
def test_analyzer_failure_reaches_the_report(tmp_path, monkeypatch):
    monkeypatch.setattr(checks, "analyzer", None)
    monkeypatch.setattr(checks, "_ANALYZER_MISSING", "ImportError: no analyzer here")
    model = manifest("DepthwiseCNN", tmp_path / "model.pt")
    r = run(model, "--targets", "android", "--samples", 2, "--no-latency", "--out", tmp_path / "dist")
    assert r.exit_code == 0, r.output
    t = json.loads((tmp_path / "dist" / "report.json").read_text())["targets"]["android"]
    assert t["compatibility"]["delegate"]["checked"] is False
    assert t["compatibility"]["not_checked"] == ["gpu delegate coverage: model analyzer unavailable: "
                                                 "ImportError: no analyzer here"]
    assert any("gpu delegate coverage was not checked" in w for w in t["warnings"])
    android_json = json.loads((tmp_path / "dist" / "android" / "model.json").read_text())
    assert android_json["warnings"] == t["warnings"]
    assert np.isfinite(t["parity"]["cosine"])
