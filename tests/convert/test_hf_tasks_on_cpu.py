"""Hugging Face task folders converted by the folder alone (issue 39): tiny ViT, BERT (sequence
and token classification), Wav2Vec2, Segformer and DETR folders trained for seconds and saved with
their processors, each through `tpu-pipeline convert FOLDER --eval-data RAW` with raw data, each
target judged by its task score (accuracy, entity F1, mean IoU, mAP@0.5) against PyTorch's through the
same processor."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tpu_pipeline.cli import cli
from tpu_pipeline.testing import hf_task_folders as hf

pytestmark = pytest.mark.slow

CASES = {  # folder builder, raw data builder, task, metric, PyTorch's score at least (trained for seconds)
    "vit": (hf.save_vit, lambda d: hf.image_folder(d / "images"), "image-classification", "accuracy", 0.9),
    "bert_seq": (hf.save_bert_seq, lambda d: hf.sentiment_csv(d / "sent.csv"), "sequence-classification",
                 "accuracy", 0.9),
    "bert_tok": (hf.save_bert_tok, lambda d: hf.entity_jsonl(d / "ent.jsonl"), "token-classification",
                 "entity_f1", 0.8),
    "wav2vec2": (hf.save_wav2vec2, lambda d: hf.wav_folder(d / "wavs"), "audio-classification", "accuracy", 0.9),
    "segformer": (hf.save_segformer, lambda d: hf.mask_folder(d / "scenes"), "semantic-segmentation", "miou", 0.7),
    # a tiny DETR trained for seconds finds few boxes (mAP ~0.003 after 60 steps, 0.04 after 2,000): the test
    # checks the artifact's mAP equals PyTorch's; test_hf_data_on_cpu.py checks the metric on known boxes
    "detr": (hf.save_detr, lambda d: hf.box_folder(d / "boxes"), "object-detection", "map50", 0.0),
}


def run(*args):
    return CliRunner().invoke(cli, ["convert", *map(str, args)])


@pytest.mark.parametrize("name", list(CASES))
def test_folder_converts_with_raw_eval_data_alone(tmp_path, name):
    save, raw, task, metric, floor = CASES[name]
    folder, data = save(tmp_path / name), raw(tmp_path)
    r = run(folder, "--eval-data", data, "--targets", "desktop", "--out", tmp_path / "dist", "--no-latency")
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "dist" / "report.json").read_text())
    assert rep["kind"] == "hf-task" and rep["task"] == task
    assert rep["hf"]["labels"] == list(json.loads((folder / "config.json").read_text())["id2label"].values())
    ts = rep["task_score"]
    assert ts["metric"] == metric and ts["torch_score"] >= floor, ts
    got = rep["targets"]["desktop"]["parity"]["task_score"]
    # float32 on XNNPACK: the same decisions as PyTorch on every labelled row
    assert got["score"] == pytest.approx(ts["torch_score"], abs=1e-9) and got["passed"]
    assert (tmp_path / "dist" / "desktop" / "model.tflite").stat().st_size > 0


def test_image_classifier_is_app_ready_on_android(tmp_path):
    """The processor's normalisation and id2label become the app description: an NHWC input with
    MediaPipe metadata, checked in MediaPipe's ImageClassifier; --calib takes a raw image folder."""
    folder = hf.save_vit(tmp_path / "vit")
    data, calib = hf.image_folder(tmp_path / "images"), hf.image_folder(tmp_path / "calib", 12, seed=7)
    r = run(folder, "--eval-data", data, "--calib", calib, "--targets", "android", "--out", tmp_path / "dist",
            "--no-latency")
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "dist" / "report.json").read_text())
    assert rep["inputs"][0]["shape"] == [1, hf.IMAGE, hf.IMAGE, 3]
    android = rep["targets"]["android"]
    assert android["parity"]["task_score"]["passed"]
    client = android["parity"]["app"]["client"]
    assert client["passed"], client
    model_json = json.loads((tmp_path / "dist" / "android" / "model.json").read_text())
    assert model_json["app"]["task"] == "ImageClassifier"
