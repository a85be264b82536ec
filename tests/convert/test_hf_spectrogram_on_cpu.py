"""Audio classifiers on spectrogram features (issue 39): tiny ASTForAudioClassification and
WhisperForAudioClassification folders. The features run outside the artifact: it takes the folder's
feature extractor's output, the .wav rows go through that extractor for PyTorch and the artifact
alike, and the report says what an app computes. Bad input is one line, exit 2, as for Wav2Vec2."""

from __future__ import annotations

import json
import shutil
import wave

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from tpu_pipeline.cli import cli
from tpu_pipeline.convert.hf.kind import HFTaskKind
from tpu_pipeline.convert.options import ConvertOptions
from tpu_pipeline.testing import hf_task_folders as hf

# name -> (builder, the artifact's input, its shape, the report's layout)
CASES = {"ast": (hf.save_ast, "input_values", [1, 64, 16], "[1, frames, mel bins]"),
         "whisper": (hf.save_whisper, "input_features", [1, 16, 100], "[1, mel bins, frames]")}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec")
    return {"ast": hf.save_ast(root / "ast", steps=2), "whisper": hf.save_whisper(root / "whisper", steps=2),
            "wavs": hf.wav_folder(root / "wavs", 4)}


def _read_wav(path):
    with wave.open(str(path), "rb") as w:
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768


def run(*args):
    # one target without a browser or GPU child: bad input is refused at load, before any child would start
    return CliRunner().invoke(cli, ["convert", *map(str, args), "--targets", "desktop"])


def _one_line(r, *words):
    assert r.exit_code == 2, r.output
    errors = [ln for ln in r.output.strip().splitlines() if ln.startswith("Error: ")]
    assert len(errors) == 1 and r.output.strip().endswith(errors[0]) and "Traceback" not in r.output, r.output
    for w in words:
        assert w in errors[0], errors[0]


@pytest.mark.parametrize("name", list(CASES))
def test_rows_are_the_folders_extractor_output(folders, name):
    """The artifact's input is the extractor's output; each --eval-data clip goes through the folder's own
    extractor, and the graph gives what the Transformers model gives on it."""
    from transformers import AutoFeatureExtractor, AutoModelForAudioClassification

    _, feature, shape, layout = CASES[name]
    kind = HFTaskKind.load(folders[name], ConvertOptions(eval_data=folders["wavs"]), np.random.default_rng(0),
                           lambda _m: None)
    assert kind.m.input_names == [feature] and list(kind.m.sample_args[0].shape) == shape
    files = sorted(folders["wavs"].glob("*.wav"))
    fe = AutoFeatureExtractor.from_pretrained(folders[name])
    want = fe([_read_wav(f) for f in files], sampling_rate=hf.RATE, return_tensors="np")[feature]
    np.testing.assert_array_equal(np.concatenate([r[0] for r in kind.eval_set.rows]), want)
    assert kind.eval_set.labels.tolist() == [i % 2 for i in range(len(files))]
    model = AutoModelForAudioClassification.from_pretrained(folders[name]).eval()
    with torch.no_grad():
        torch_logits = model(**{feature: torch.from_numpy(want[:1])}).logits
        got = kind.m.module(torch.from_numpy(want[:1]))[0]  # the app graph's softmax appended (labels given)
    np.testing.assert_allclose(got.numpy(), torch_logits.softmax(-1).numpy(), atol=1e-5)
    # labels only: MediaPipe's AudioClassifier would feed the model a waveform
    assert kind.app.audio is None and kind.app.labels.names == hf.TONES
    assert any(n.startswith("features outside the artifact") and feature in n for n in kind.m.notes)
    assert any(n.startswith("no MediaPipe AudioClassifier metadata (labels only)") for n in kind.m.notes)
    hf_report = kind.report_fields()["hf"]
    assert hf_report["input"] == {"name": feature, "shape": shape, "layout": layout, "mel_bins": 16,
                                  "frames": 64 if name == "ast" else 100}
    assert hf_report["features"].startswith("outside the artifact")


def test_report_names_what_the_app_computes(folders):
    kind = HFTaskKind.load(folders["ast"], ConvertOptions(), np.random.default_rng(0), lambda _m: None)
    ast = kind.report_fields()["hf"]
    assert ast["feature_extractor"] == "ASTFeatureExtractor" and ast["sampling_rate"] == hf.RATE
    assert ast["extractor"]["num_mel_bins"] == 16 and ast["extractor"]["max_length"] == 64
    assert ast["extractor"]["mean"] == pytest.approx(-4.2677393) and ast["extractor"]["std"] == pytest.approx(4.5689974)
    assert "(x - mean) / (2 * std)" in ast["recipe"] and "160-sample hop" in ast["recipe"]
    kind = HFTaskKind.load(folders["whisper"], ConvertOptions(), np.random.default_rng(0), lambda _m: None)
    whisper = kind.report_fields()["hf"]["extractor"]
    assert (whisper["feature_size"], whisper["n_fft"], whisper["hop_length"], whisper["chunk_length"],
            whisper["n_samples"], whisper["nb_max_frames"]) == (16, 400, 160, 1, 16000, 100)


@pytest.mark.parametrize("name", list(CASES))
def test_another_rate_is_refused(folders, tmp_path, name):
    w = shutil.copytree(folders["wavs"], tmp_path / "wavs")
    hf.write_wav(w / "clip_000.wav", hf.tone(np.random.default_rng(0), 0), rate=8000)
    _one_line(run(folders[name], "--eval-data", w, "--out", tmp_path / "o"), str(w / "clip_000.wav"), "8000 Hz",
              "16000 Hz")
    assert not (tmp_path / "o").exists()


def test_max_len_is_refused(folders, tmp_path):
    _one_line(run(folders["ast"], "--max-len", "100", "--out", tmp_path / "o"), "--max-len 100",
              "input_values [1, 64, 16]", "fixed by the extractor")


def test_extractor_the_model_does_not_take_is_refused(folders, tmp_path):
    """Whisper's own 30 s window (3000 frames) against an encoder of 50 positions (100 frames)."""
    d = shutil.copytree(folders["whisper"], tmp_path / "whisper")
    cfg = json.loads((d / "preprocessor_config.json").read_text())
    cfg.update(chunk_length=30, n_samples=480000, nb_max_frames=3000)
    (d / "preprocessor_config.json").write_text(json.dumps(cfg))
    _one_line(run(d, "--out", tmp_path / "o"), str(d), "WhisperForAudioClassification does not take",
              "input_features [1, 16, 3000]")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_folder_converts_with_a_wav_folder_alone(tmp_path, name):
    """`convert FOLDER --eval-data WAVS`: the artifact takes the features, scores as PyTorch does on the same
    extractor output, and the report says the features run outside it."""
    save, feature, shape, _ = CASES[name]
    folder, data = save(tmp_path / name), hf.wav_folder(tmp_path / "wavs")
    r = CliRunner().invoke(cli, ["convert", str(folder), "--eval-data", str(data), "--targets", "desktop", "--out",
                                 str(tmp_path / "dist"), "--no-latency"])
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "dist" / "report.json").read_text())
    assert rep["kind"] == "hf-task" and rep["task"] == "audio-classification"
    assert rep["inputs"] == [{"name": feature, "shape": shape, "dtype": "float32"}]
    ts = rep["task_score"]
    assert ts["metric"] == "accuracy" and ts["rows"] == 16 and ts["torch_score"] >= 0.9, ts
    got = rep["targets"]["desktop"]["parity"]["task_score"]
    assert got["score"] == pytest.approx(ts["torch_score"], abs=1e-9) and got["passed"]
    assert rep["hf"]["features"].startswith("outside the artifact") and rep["hf"]["input"]["name"] == feature
    assert any(n.startswith(f"features outside the artifact: an app computes {rep['hf']['feature_extractor']}'s "
                            f"{feature} {shape}") for n in rep["notes"])
    app = json.loads((tmp_path / "dist" / "desktop" / "model.json").read_text())["app"]
    assert app["task"] is None and app["labels"] == list(hf.TONES)  # labels only: no AudioClassifier metadata
