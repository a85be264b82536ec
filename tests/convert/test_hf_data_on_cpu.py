"""Hugging Face task folders (issue 39), what needs no export: detection by config.json's
architectures, raw data through the folder's own processor (the same tensors Transformers'
processor gives), entity F1, and every bad input as one line with exit 2, nothing written."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from tpu_pipeline.cli import cli
from tpu_pipeline.convert.hf.folder import open_folder
from tpu_pipeline.convert.hf.kind import HFTaskKind
from tpu_pipeline.convert.lm.kind import CausalLMKind
from tpu_pipeline.convert.module.kind import ModuleKind
from tpu_pipeline.convert.pipeline import model_kind
from tpu_pipeline.convert.verdict import task_score
from tpu_pipeline.testing import hf_task_folders as hf


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {"vit": hf.save_vit(root / "vit", steps=5), "bert_seq": hf.save_bert_seq(root / "bert_seq", steps=5),
            "bert_tok": hf.save_bert_tok(root / "bert_tok", steps=5),
            "wav2vec2": hf.save_wav2vec2(root / "wav2vec2", steps=2), "images": hf.image_folder(root / "images", 6),
            "csv": hf.sentiment_csv(root / "sent.csv", 6), "jsonl": hf.entity_jsonl(root / "ent.jsonl", 6),
            "wavs": hf.wav_folder(root / "wavs", 4)}


def _kind(path):
    return model_kind(path)


def test_detection_is_by_architectures(folders, tmp_path):
    for name in ("vit", "bert_seq", "bert_tok", "wav2vec2"):
        assert _kind(folders[name]) is HFTaskKind, name
    # a BERT classifier has config.json + tokenizer.json, like a causal LM: the architecture decides
    assert (folders["bert_seq"] / "tokenizer.json").is_file()
    lm = tmp_path / "lm"
    shutil.copytree(folders["bert_seq"], lm)
    cfg = json.loads((lm / "config.json").read_text())
    (lm / "config.json").write_text(json.dumps({**cfg, "architectures": ["LlamaForCausalLM"]}))
    assert _kind(lm) is CausalLMKind
    (lm / "config.json").write_text(json.dumps({**cfg, "architectures": []}))
    assert _kind(lm) is ModuleKind  # no head named: the module kind's fixed-length forward, as before


def test_labels_come_from_id2label(folders):
    f = open_folder(folders["bert_tok"])
    assert f.labels == hf.TAGS and f.label2id["B-LOC"] == 3


def test_image_rows_are_the_processors_own(folders):
    from PIL import Image
    from transformers import ViTImageProcessorPil

    kind = HFTaskKind.load(folders["vit"], _options(eval_data=folders["images"]), np.random.default_rng(0),
                           lambda _m: None)
    files = sorted(folders["images"].rglob("*.png"), key=lambda p: (p.parent.name, p.name))
    proc = ViTImageProcessorPil.from_pretrained(folders["vit"])
    want = proc([np.asarray(Image.open(f).convert("RGB")) for f in files], return_tensors="np")["pixel_values"]
    # the artifact's input is NHWC (app graph); the rows follow it
    got = np.concatenate([r[0] for r in kind.eval_set.rows])
    np.testing.assert_array_equal(got, want.transpose(0, 2, 3, 1))
    assert kind.eval_set.labels.tolist() == [hf.COLOURS.index(f.parent.name) for f in files]
    assert kind.app.image.mean == pytest.approx((127.5,) * 3) and kind.app.labels.names == hf.COLOURS


def test_audio_normalisation_folded_in_equals_the_feature_extractor(folders):
    from transformers import AutoFeatureExtractor, Wav2Vec2ForSequenceClassification

    kind = HFTaskKind.load(folders["wav2vec2"], _options(eval_data=folders["wavs"]), np.random.default_rng(0),
                           lambda _m: None)
    fe = AutoFeatureExtractor.from_pretrained(folders["wav2vec2"])
    model = Wav2Vec2ForSequenceClassification.from_pretrained(folders["wav2vec2"]).eval()
    clip = kind.eval_set.rows[0][0]  # the raw waveform, as an app records it
    assert abs(float(clip.mean())) < 0.05 and clip.shape == (1, 8000)
    with torch.no_grad():
        want = model(**fe(clip[0], sampling_rate=hf.RATE, return_tensors="pt")).logits.softmax(-1)
        got = kind.m.module(torch.from_numpy(clip))
    np.testing.assert_allclose(got[0].numpy(), want.numpy(), atol=1e-5)


def test_token_labels_on_each_words_first_subtoken(folders):
    kind = HFTaskKind.load(folders["bert_tok"], _options(eval_data=folders["jsonl"]), np.random.default_rng(0),
                           lambda _m: None)
    rows = [json.loads(line) for line in folders["jsonl"].read_text().splitlines()]
    labels = kind.eval_set.labels
    assert labels.shape == (len(rows), 32)
    for row, y in zip(rows, labels):
        assert [hf.TAGS[k] for k in y[y != -100]] == row["tags"]
    assert kind.metric_spec.name == "entity_f1"  # scored once the float graph is exported


@pytest.mark.parametrize("gold, pred, f1", [
    (["B-PER", "I-PER", "O", "B-LOC"], ["B-PER", "I-PER", "O", "B-LOC"], 1.0),
    (["B-PER", "I-PER", "O", "B-LOC"], ["B-PER", "O", "O", "B-LOC"], 0.5),   # a cut entity is wrong
    (["B-PER", "I-PER", "O", "O"], ["I-PER", "I-PER", "O", "B-LOC"], 2 / 3),  # I- after O starts one (conlleval)
    (["O", "O"], ["O", "O"], 1.0),
])
def test_entity_f1(gold, pred, f1):
    names = ("O", "B-PER", "I-PER", "B-LOC")
    y = np.array([[names.index(t) for t in gold] + [-100]])
    out = np.zeros((1, len(gold) + 1, len(names)))
    for i, t in enumerate(pred):
        out[0, i, names.index(t)] = 1
    assert task_score.entity_f1(names).fn(out, y) == pytest.approx(f1)


def _options(**kw):
    from tpu_pipeline.convert.options import ConvertOptions

    return ConvertOptions(**kw)


def run(*args):
    # one target without a browser or GPU child: bad input is refused at load, before any child would start
    return CliRunner().invoke(cli, ["convert", *map(str, args), "--targets", "desktop"])


def _one_line(r, *words, out=None):
    assert r.exit_code == 2, r.output
    # progress lines come first; the error is one line, last, without a traceback
    errors = [ln for ln in r.output.strip().splitlines() if ln.startswith("Error: ")]
    assert len(errors) == 1 and r.output.strip().endswith(errors[0]) and "Traceback" not in r.output, r.output
    for w in words:
        assert w in errors[0], errors[0]
    assert out is None or not out.exists()


def test_remote_code_is_refused(folders, tmp_path):
    d = shutil.copytree(folders["bert_seq"], tmp_path / "remote")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "auto_map": {"AutoModel": "modeling_x.X"}}))
    _one_line(run(d, "--out", tmp_path / "o"), str(d / "config.json"), "auto_map", out=tmp_path / "o")


def test_unknown_head_is_refused(folders, tmp_path):
    d = shutil.copytree(folders["bert_seq"], tmp_path / "mlm")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "architectures": ["BertForMaskedLM"]}))
    _one_line(run(d, "--out", tmp_path / "o"), "BertForMaskedLM", "no task head", "AutoModelForImageClassification",
              out=tmp_path / "o")


@pytest.mark.parametrize("name, missing", [("vit", "preprocessor_config.json"), ("bert_seq", "tokenizer.json"),
                                           ("wav2vec2", "preprocessor_config.json")])
def test_missing_processor_is_refused(folders, tmp_path, name, missing):
    d = shutil.copytree(folders[name], tmp_path / name)
    (d / missing).unlink()
    _one_line(run(d, "--out", tmp_path / "o"), str(d / missing), "missing", out=tmp_path / "o")


def test_label_not_in_label2id_is_refused(folders, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text(folders["csv"].read_text() + "the film was fine,neutral\n")
    _one_line(run(folders["bert_seq"], "--eval-data", bad, "--out", tmp_path / "o"), str(bad), "line 8",
              "'neutral'", "label2id", out=tmp_path / "o")
    d = shutil.copytree(folders["images"], tmp_path / "imgs")
    (d / "purple").mkdir()
    shutil.copy(next((d / "red").iterdir()), d / "purple" / "x.png")
    _one_line(run(folders["vit"], "--eval-data", d, "--out", tmp_path / "o"), str(d / "purple" / "x.png"),
              "'purple'", out=tmp_path / "o")


def test_unreadable_files_are_refused(folders, tmp_path):
    d = shutil.copytree(folders["images"], tmp_path / "imgs")
    (d / "red" / "broken.png").write_bytes(b"not a png")
    _one_line(run(folders["vit"], "--eval-data", d, "--out", tmp_path / "o"), str(d / "red" / "broken.png"),
              "not a readable image", out=tmp_path / "o")
    w = shutil.copytree(folders["wavs"], tmp_path / "wavs")
    (w / "clip_000.wav").write_bytes(b"RIFF")
    _one_line(run(folders["wav2vec2"], "--eval-data", w, "--out", tmp_path / "o"), str(w / "clip_000.wav"),
              "not a readable PCM .wav", out=tmp_path / "o")
    hf.write_wav(w / "clip_000.wav", hf.tone(np.random.default_rng(0), 0), rate=8000)
    _one_line(run(folders["wav2vec2"], "--eval-data", w, "--out", tmp_path / "o"), "8000 Hz", "16000 Hz",
              out=tmp_path / "o")


def test_lm_only_options_are_refused(folders, tmp_path):
    _one_line(run(folders["vit"], "--prompts", tmp_path / "p.txt", "--out", tmp_path / "o"), "--prompts",
              "causal-LM", out=tmp_path / "o")
    _one_line(run(folders["vit"], "--input-shape", "1,3,32,32", "--out", tmp_path / "o"), "--input-shape",
              out=tmp_path / "o")


def _detections(boxes_per_image, classes=2):
    """[(class, score, cx, cy, w, h), ...] per image -> DETR-style (logits, pred_boxes), one query each."""
    q = max(len(b) for b in boxes_per_image)
    logits = np.full((len(boxes_per_image), q, classes + 1), -20.0)
    logits[..., -1] = 20.0  # unused queries: no object
    boxes = np.full((len(boxes_per_image), q, 4), 0.5)
    for i, dets in enumerate(boxes_per_image):
        for j, (c, s, cx, cy, w, h) in enumerate(dets):
            logits[i, j] = -20.0
            logits[i, j, c], logits[i, j, -1] = np.log(s), np.log(1 - s)
            boxes[i, j] = (cx, cy, w, h)
    return [logits, boxes]


def _gt(*rows):
    return np.array(rows, np.float64).reshape(-1, 5)


def test_map50():
    metric = task_score.map50(2)
    labels = np.empty(2, object)
    labels[0], labels[1] = _gt((0, 0.1, 0.1, 0.3, 0.3)), _gt((1, 0.5, 0.5, 0.9, 0.9))
    exact = _detections([[(0, 0.9, 0.2, 0.2, 0.2, 0.2)], [(1, 0.8, 0.7, 0.7, 0.4, 0.4)]])
    assert metric.fn(exact, labels) == pytest.approx(1.0)
    wrong_class = _detections([[(1, 0.9, 0.2, 0.2, 0.2, 0.2)], [(1, 0.8, 0.7, 0.7, 0.4, 0.4)]])
    # class 0 missed (AP 0); class 1 found, below a false positive scored higher (AP 0.5)
    assert metric.fn(wrong_class, labels) == pytest.approx(0.25)
    shifted = _detections([[(0, 0.9, 0.3, 0.3, 0.2, 0.2)], [(1, 0.8, 0.7, 0.7, 0.4, 0.4)]])  # IoU 1/7 < 0.5
    assert metric.fn(shifted, labels) == pytest.approx(0.5)
    # a confident false positive ranked above the true one halves class 0's precision at full recall
    labels[1] = _gt((0, 0.5, 0.5, 0.9, 0.9))
    ranked = _detections([[(0, 0.6, 0.2, 0.2, 0.2, 0.2)], [(0, 0.9, 0.2, 0.2, 0.2, 0.2), (0, 0.5, 0.7, 0.7, 0.4, 0.4)]])
    # detections by score: FP (0.9), TP (0.6), TP (0.5): precision 1/2 then 2/3 at recalls 0.5, 1.0
    assert metric.fn(ranked, labels) == pytest.approx(2 / 3)


def test_box_labels_are_checked(tmp_path):
    d = hf.box_folder(tmp_path / "boxes", 2)
    (d / "boxes.csv").write_text("file_name,label,x0,y0,x1,y1\nscene_000.png,green,1,1,5,5\n")
    folder = hf.save_detr(tmp_path / "detr", steps=1)
    _one_line(run(folder, "--eval-data", d, "--out", tmp_path / "o"), str(d / "boxes.csv"), "line 1", "'green'",
              out=tmp_path / "o")
    (d / "boxes.csv").write_text("scene_000.png,red,5,1,1,5\n")
    _one_line(run(folder, "--eval-data", d, "--out", tmp_path / "o"), "line 1", "empty box", out=tmp_path / "o")
