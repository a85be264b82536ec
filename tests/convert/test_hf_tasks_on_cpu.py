"""Hugging Face task folders converted by the folder alone (issue 39): tiny ViT, BERT (sequence
and token classification), Wav2Vec2, Segformer and DETR folders trained for seconds and saved with
their processors, each through `tpu-pipeline convert FOLDER --eval-data RAW` with raw data, each
target judged by its task score (accuracy, entity F1, mean IoU, mAP@0.5) against PyTorch's through the
same processor."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from click.testing import CliRunner

from tpu_pipeline.cli import cli
from tpu_pipeline.testing import hf_task_folders as hf

pytestmark = pytest.mark.slow

CASES = {  # folder builder, raw data builder, task, metric, PyTorch's score at least (trained for seconds)
    "vit": (hf.save_vit, lambda d: hf.image_folder(d / "images"), "image-classification", "accuracy", 0.9),
    "bert_seq": (hf.save_bert_seq, lambda d: hf.sentiment_csv(d / "sent.csv"), "sequence-classification",
                 "accuracy", 0.9),
    # two inputs (no token_type_ids): the artifact takes a third MediaPipe fills and the graph ignores
    "distilbert_seq": (hf.save_distilbert_seq, lambda d: hf.sentiment_csv(d / "sent.csv"), "sequence-classification",
                       "accuracy", 0.9),
    # a SentencePiece (Unigram) tokenizer: MediaPipe gets the SentencePiece model written from tokenizer.json
    "albert_seq": (hf.save_albert_seq, lambda d: hf.sentiment_csv(d / "sent.csv"), "sequence-classification",
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
    if task == "sequence-classification":  # a WordPiece tokenizer: MediaPipe's TextClassifier on the raw CSV
        client = rep["targets"]["desktop"]["parity"]["app"]["client"]
        assert client["passed"] and client["task_score"]["score"] == pytest.approx(ts["torch_score"], abs=1e-9)
        assert [i["name"] for i in rep["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]


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


def _cased_sentences(path, n=16):
    """The sentiment rows as people type them (capitals, punctuation): MediaPipe lower-cases and splits
    punctuation itself, as the folder's tokenizer does."""
    rows = hf.sentiment_rows(np.random.default_rng(3), n)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows((t.capitalize() + ("!" if i % 2 else ", really."), lab) for i, (t, lab) in enumerate(rows))
    return path


def test_text_classifier_is_app_ready_on_android_and_web(tmp_path):
    """The BERT folder's tokenizer.json becomes MediaPipe's BERT metadata: three int32 inputs, the
    WordPiece vocab packed; MediaPipe's TextClassifier (Python, and the web one in Chromium) tokenizes
    the raw CSV sentences itself and scores as PyTorch does through the folder's tokenizer."""
    folder = hf.save_bert_seq(tmp_path / "bert")
    data = _cased_sentences(tmp_path / "typed.csv")
    r = run(folder, "--eval-data", data, "--targets", "android,web", "--out", tmp_path / "dist", "--no-latency")
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "dist" / "report.json").read_text())
    assert [i["dtype"] for i in rep["inputs"]] == ["int32"] * 3
    torch_score = rep["task_score"]["torch_score"]
    assert torch_score >= 0.9
    for target in ("android", "web"):
        app = rep["targets"][target]["parity"]["app"]
        assert sorted(app["metadata"]["files"]) == ["labels.txt", "vocab.txt"]
        assert app["metadata"]["min_parser_version"] == "1.1.0"  # BertTokenizerOptions (metadata_version.cc)
        c = app["client"]
        assert c["passed"] and c["task"] == "TextClassifier" and c["rows"] == 16, c
        assert c["sentences"][0][0].isupper()  # the raw sentences, not ids decoded back
        assert c["task_score"]["score"] == pytest.approx(torch_score, abs=1e-9)
        # MediaPipe's own tokenizing gives the ids the folder's tokenizer gives: the same scores as ai-edge-litert
        assert c["vs_runtime_same_raw"]["top1_agreement"] == 1.0 and c["vs_runtime_same_raw"]["max_abs"] < 1e-5
    web = rep["targets"]["web"]["parity"]["app"]["client"]["web"]
    assert web["task_score"]["score"] == pytest.approx(torch_score, abs=1e-9) and web["max_abs_vs_python"] < 1e-5
    mj = json.loads((tmp_path / "dist" / "android" / "model.json").read_text())
    assert mj["app"]["task"] == "TextClassifier" and mj["app"]["text"]["tokenizer"] == "bert"
    assert mj["app"]["text"]["inputs"] == {"ids": "input_ids", "mask": "attention_mask",
                                           "segment_ids": "token_type_ids"}


def test_text_classifier_without_sentences_writes_metadata_and_says_the_check_did_not_run(tmp_path):
    """No --eval-data: the parity rows are random ids, no sentence MediaPipe could be handed; the
    metadata is still written and read back, and the report says the client check did not run."""
    folder = hf.save_bert_seq(tmp_path / "bert", steps=5)
    r = run(folder, "--targets", "desktop", "--out", tmp_path / "dist", "--no-latency")
    assert r.exit_code == 0, r.output
    desktop = json.loads((tmp_path / "dist" / "report.json").read_text())["targets"]["desktop"]
    app = desktop["parity"]["app"]
    assert "client" not in app and "no raw sentences" in app["client_skipped"]
    assert sorted(app["metadata"]["files"]) == ["labels.txt", "vocab.txt"]
    assert any("no raw sentences" in w for w in desktop["warnings"])
