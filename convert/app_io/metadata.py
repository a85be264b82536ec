"""TFLite metadata, the schema MediaPipe Tasks, Android Studio's ML Model Binding and LiteRT's
support library read: the model's name, description, version, author and licence; the input's
image properties and NormalizationOptions, audio properties, or regex tokenizer with its vocab;
a BERT model's ids/mask/segment_ids inputs and its BertTokenizerOptions with the WordPiece vocab;
the output's labels as a TENSOR_AXIS_LABELS file. Written by MediaPipe's own code in its venv
(_mediapipe_worker.py: its schema module and MetadataPopulator) and read back there by its
MetadataDisplayer: metadata MediaPipe cannot read fails the target (ConversionError)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from tpu_pipeline.convert.app_io.spec import AppIO, tokenizer_file
from tpu_pipeline.convert.app_io.worker import call
from tpu_pipeline.errors import ConversionError

LABELS_FILE = "labels.txt"
VOCAB_FILE = "vocab.txt"


def request(app: AppIO, info) -> dict:
    """The metadata to write, as the worker takes it (plain JSON); info: the artifact's ModelInfo
    (its tensors' count and order)."""
    input_dtype = info.inputs[0].dtype
    fields = {"version": "1", **app.info}
    spec = app.input
    if app.image is not None:
        img = app.image
        lo = [(0.0 - m) / s for m, s in zip(np.broadcast_to(img.mean, 3), np.broadcast_to(img.std, 3))]
        hi = [(255.0 - m) / s for m, s in zip(np.broadcast_to(img.mean, 3), np.broadcast_to(img.std, 3))]
        inp = {"kind": "image", "name": img.name, "mean": list(img.mean), "std": list(img.std),
               "min": [float(min(a, b)) for a, b in zip(lo, hi)], "max": [float(max(a, b)) for a, b in zip(lo, hi)],
               "description": f"RGB image [1, H, W, 3], {input_dtype}; model input = (pixel - mean) / std"}
    elif app.audio is not None:
        inp = {"kind": "audio", "name": spec.name, "rate": spec.rate,
               "description": f"mono waveform in -1..1 at {spec.rate} Hz"}
    elif app.text is not None and spec.bert_style:
        # MediaPipe's BERT preprocessor finds its three tensors by these metadata names (bert_preprocessor_calculator)
        inp = {"kind": "bert", "name": spec.name, "tokenizer": spec.tokenizer, "vocab_file": tokenizer_file(spec)[0],
               "positions": {role: info.inputs[app.input_names.index(n)].position
                             for role, n in zip(("ids", "mask", "segment_ids"), spec.names)},
               "description": f"{spec.tokenizer} token ids of the sentence: [CLS] pieces [SEP], 0 after"}
    elif app.text is not None:
        inp = {"kind": "text", "name": spec.name, "vocab_file": VOCAB_FILE, "delimiter": spec.delimiter,
               "description": "token ids from the regex tokenizer (vocab.txt)"}
    else:
        inp = {"kind": None, "name": "input", "description": ""}
    out = {"name": "probability" if app.labels else "scores", "description": "class scores, index = class",
           "labels_file": LABELS_FILE if app.labels else None, "probabilities": app.labels is not None}
    return {"op": "write", "metadata": {**fields, "input": inp, "output": out}, "n_inputs": len(info.inputs),
            "n_outputs": len(info.outputs), "output_position": info.outputs[0].position}


def write(model: bytes, app: AppIO, info) -> tuple[bytes, dict]:
    """`model` with the metadata and its associated files -> (the bytes, the metadata as MediaPipe's
    reader shows it: {"json": ..., "files": [...]})."""
    req = request(app, info)
    with tempfile.TemporaryDirectory(prefix="tpu-pipeline-metadata-") as d:
        d = Path(d)
        (d / "in.tflite").write_bytes(model)
        files = {}
        if app.labels is not None:
            (d / LABELS_FILE).write_text("\n".join(app.labels.names) + "\n", encoding="utf-8")
            files[LABELS_FILE] = str(d / LABELS_FILE)
        if app.text is not None and app.text.bert_style:  # the vocab one token a line, or the SentencePiece model
            name, data, _ = tokenizer_file(app.text)
            (d / name).write_bytes(data)
            files[name] = str(d / name)
        elif app.text is not None:
            (d / VOCAB_FILE).write_bytes(Path(app.text.vocab).read_bytes())
            files[VOCAB_FILE] = str(d / VOCAB_FILE)
        req.update(model=str(d / "in.tflite"), out=str(d / "out.tflite"), files=files)
        shown = call(req, "TFLite metadata")
        written = (d / "out.tflite").read_bytes()
    missing = sorted(set(files) - set(shown.get("files", [])))
    if missing:
        raise ConversionError(f"TFLite metadata: MediaPipe's reader finds no {', '.join(missing)} in the written file")
    return written, shown


def app_json(app: AppIO, info, written: dict | None) -> dict:
    """model.json's `app`: what the app hands over and how it becomes the input, the labels, the
    MediaPipe task, and the metadata as MediaPipe read it back (info: the artifact's ModelInfo)."""
    t = info.inputs[0] if info else None
    out: dict = {"task": app.task if written else None,  # iot: TFLM reads no metadata, no MediaPipe task
                 "labels": list(app.labels.names) if app.labels else None,
                 "labels_from": app.labels.source if app.labels else None}
    if app.image is not None:
        img = app.image
        out["image"] = {"input": img.name, "layout": "NHWC", "pytorch_layout": img.layout, "color": "RGB",
                        "mean": list(img.mean), "std": list(img.std), "pixel_to_input": "(pixel - mean) / std"}
        if t is not None and t.dtype in ("int8", "uint8") and t.scale:
            out["image"]["pixel_to_" + t.dtype] = {
                "formula": "round((pixel - mean) / std / scale) + zero_point", "scale": t.scale,
                "zero_point": t.zero_point}
    elif app.audio is not None:
        out["audio"] = {"input": app.audio.name, "sample_rate": app.audio.rate, "channels": 1, "range": [-1.0, 1.0]}
    elif app.text is not None:
        t = app.text
        packed = tokenizer_file(t)[0] if t.bert_style else VOCAB_FILE
        out["text"] = {"input": t.name, "tokenizer": t.tokenizer, "vocab": f"{packed} (packed in model.tflite)",
                       "vocab_from": str(t.vocab), "dtype": "int32"}
        if t.bert_style:
            out["text"].update(inputs={"ids": t.names[0], "mask": t.names[1], "segment_ids": t.names[2]},
                               sentence_to_input=("ASCII lower-case, " + (
                                   "SentencePiece" if t.tokenizer == "sentencepiece" else
                                   "split on whitespace and punctuation, WordPiece (##)") +
                                   ", [CLS] pieces [SEP], cut or padded with 0 to the input length"))
        else:
            out["text"]["delimiter"] = t.delimiter
    if written:
        out["metadata"] = written.get("metadata")
        if "client" in written:
            c = written["client"]
            out["mediapipe"] = {"task": c["task"], "passed": c["passed"], "client": c["client"],
                                **({"score": c["task_score"].get("score")} if "task_score" in c else {})}
    return out
