"""The verdict through the client apps use: the artifact (with its metadata) created as its
MediaPipe task (Python Tasks: the same C++ task graphs as Android and iOS) in the MediaPipe
child, fed the rows as an app hands them over (uint8 RGB images, float waveforms, sentences) and
left to do its own preprocessing (resize, (pixel - mean) / std from the metadata, framing,
tokenizing). Its scores are judged twice: with labels, by the task metric against PyTorch's
(the same bound as the target's runtime); always, against the same artifact on ai-edge-litert
fed the same raw data by this package's reading of the metadata, which tells a client that reads
the file differently from a model that scores differently. A BERT model's sentences are the raw
eval texts (the CSV/JSONL rows): MediaPipe tokenizes them itself, ai-edge-litert gets the folder's
tokenizer's ids for them, so that comparison also tells whether MediaPipe tokenizes as the model's
tokenizer does."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from tpu_pipeline.convert.app_io.graph import from_pixels, to_pixels
from tpu_pipeline.convert.app_io.spec import PAD, START, UNKNOWN, AppIO, read_vocab
from tpu_pipeline.convert.app_io.worker import call
from tpu_pipeline.convert.runtimes import browser
from tpu_pipeline.convert.runtimes.litert import LitertRunner
from tpu_pipeline.convert.tflite_info import ModelInfo
from tpu_pipeline.convert.verdict.task_score import TaskScore
from tpu_pipeline.errors import ConversionError

CLIPPED_HINT = 0.01  # share of image values beyond 0..255 as pixels that names --image mean/std in a failure
MIN_AGREEMENT = 0.98  # top-1 agreement with ai-edge-litert on the same raw rows (near-tie rows may flip)
TASKS = {"image": "ImageClassifier", "audio": "AudioClassifier", "text": "TextClassifier"}
CLIENT = "MediaPipe Tasks 1.2.2 (Python; the C++ task graphs Android and iOS run)"
WEB_CLIENT = "MediaPipe Tasks for the web (npm @mediapipe/tasks-*, wasm) in headless Chromium"
# per input kind: the npm package (convert/web/package.json), its bundle and its FilesetResolver call
WEB_PACKAGES = {"image": ("tasks-vision", "vision_bundle.mjs", "forVisionTasks"),
                "audio": ("tasks-audio", "audio_bundle.mjs", "forAudioTasks"),
                "text": ("tasks-text", "text_bundle.mjs", "forTextTasks")}
WEB_TIMEOUT_S = 180
_PAGE = """<!doctype html><meta charset=utf-8>
<script type="module">
import {FilesetResolver, %(task)s} from './node_modules/@mediapipe/%(package)s/%(bundle)s';
const post = r => fetch('./result', {method: 'POST', body: JSON.stringify(r)});
try {
  const job = await (await fetch('./job.json')).json();
  const fileset = await FilesetResolver.%(fileset)s('./node_modules/@mediapipe/%(package)s/wasm');
  const task = await %(task)s.createFromOptions(fileset, {baseOptions: {modelAssetPath: './model.tflite'},
                                                          maxResults: -1});
  const rows = [];
  for (const row of job.rows) {
    const r = job.kind === 'image' ? task.classify(new ImageData(Uint8ClampedArray.from(row.rgba), row.width,
                                                                   row.height))
            : job.kind === 'audio' ? task.classify(Float32Array.from(row), job.rate)[0] : task.classify(row);
    rows.push(r.classifications[0].categories.map(c => [c.index, c.score]));
  }
  await post({ok: true, rows});
} catch (e) {
  await post({ok: false, error: String((e && e.message) || e)});
}
</script>"""


def _raw(app: AppIO, rows: list[list[np.ndarray]], texts: list[str] | None
         ) -> tuple[str, dict, list[list[np.ndarray]], dict]:
    """(task, the raw data as the worker takes it, the model input each raw row becomes by the
    metadata, notes): an app hands over 8-bit pixels, so an image row is rounded to them first.
    texts: the raw sentences the rows were tokenized from (a BERT model's rows are the model's own
    tokenizer's ids for them)."""
    if app.image is not None:
        pix, clipped = zip(*(to_pixels(r[0], app.image) for r in rows))
        return ("image", {"pixels": np.stack(pix)}, [[from_pixels(p, app.image)] for p in pix],
                {"pixels_clipped_share": float(np.mean(clipped))})
    if app.audio is not None:
        return "audio", {"waveforms": np.stack([r[0][0] for r in rows]).astype(np.float32)}, rows, {}
    if app.text.bert_style:
        return "text", {"texts": list(texts)}, rows, {"sentences": list(texts[:3]),
                                                      "runtime_rows_from": "the model's own tokenizer"}
    vocab = read_vocab(app.text)
    words = {i: w for w, i in vocab.items()}
    unknown = next(w for w in (f"zq{'q' * n}" for n in range(64)) if w not in vocab)
    skip = {vocab[PAD], vocab[START]}
    texts = [" ".join(unknown if words.get(int(i)) in (None, UNKNOWN) else words[int(i)]
                      for i in r[0][0] if int(i) not in skip) for r in rows]
    return "text", {"texts": texts}, rows, {"sentences": texts[:3]}


def web_scores(model: bytes, kind: str, raw: dict, rate: int | None, width: int) -> np.ndarray:
    """The raw rows through MediaPipe Tasks for the web in headless Chromium (the page server and
    browser the web target's LiteRT.js runs use) -> scores (rows x classes)."""
    package, bundle, fileset = WEB_PACKAGES[kind]
    if kind == "image":
        rows = [{"rgba": np.concatenate([p, np.full(p.shape[:2] + (1,), 255, np.uint8)], -1).ravel().tolist(),
                 "width": int(p.shape[1]), "height": int(p.shape[0])} for p in raw["pixels"]]
    else:
        rows = [w.tolist() for w in raw["waveforms"]] if kind == "audio" else list(raw["texts"])
    with tempfile.TemporaryDirectory(prefix="tpu-pipeline-mediapipe-web-") as d:
        site = Path(d) / "site"
        site.mkdir()
        (site / "model.tflite").write_bytes(model)
        (site / "node_modules").symlink_to(browser.litertjs_dir())
        (site / "index.html").write_text(_PAGE % {"task": TASKS[kind], "package": package, "bundle": bundle,
                                                  "fileset": fileset})
        (site / "job.json").write_text(json.dumps({"kind": kind, "rows": rows, "rate": rate}))
        result = browser._serve_and_wait(site, Path(d) / "profile", WEB_TIMEOUT_S)  # noqa: SLF001 - its page server
    if not result.get("ok"):
        raise ConversionError(f"MediaPipe {TASKS[kind]} for the web: {result.get('error', 'no result')}")
    scores = np.zeros((len(rows), width), np.float32)
    for i, cats in enumerate(result["rows"]):
        for index, score in cats:
            if index < width:
                scores[i, index] = score
    return scores


def skipped_because(app: AppIO, texts: list[str] | None) -> str | None:
    """Why the client check cannot run on these rows (None: it can): a BERT model's rows are ids,
    and ids from random parity rows or an .npz are no sentence MediaPipe could be handed."""
    if app.text is not None and app.text.bert_style and texts is None:
        return (f"MediaPipe {TASKS['text']} not run: no raw sentences to hand it (give --eval-data as a CSV or "
                "JSONL of texts); the metadata was written and read back")
    return None


def check(model: bytes, info: ModelInfo, app: AppIO, rows: list[list[np.ndarray]], task: TaskScore | None,
          max_drop: float, bound_from: str, web: bool = False, texts: list[str] | None = None) -> dict:
    """The MediaPipe task on `rows` (the app graph's input space; the eval rows when `task` scores
    them) -> report.json's `client` figures, with "passed" and, when it fails, "reason". A client
    that refuses the file raises ConversionError (one line). texts: the sentences `rows` were
    tokenized from; a BERT model's check needs them (skipped_because)."""
    kind, raw, fed, notes = _raw(app, rows, texts)
    with tempfile.TemporaryDirectory(prefix="tpu-pipeline-client-") as d:
        d = Path(d)
        (d / "model.tflite").write_bytes(model)
        np.savez(d / "rows.npz", **{k: v for k, v in raw.items() if k != "texts"})
        req = {"op": "classify", "task": kind, "model": str(d / "model.tflite"), "rows": str(d / "rows.npz"),
               "out": str(d / "out.npz"), "texts": raw.get("texts", []),
               "rate": app.audio.rate if app.audio else None}
        ans = call(req, f"MediaPipe {TASKS[kind]}")
        scores = np.load(d / "out.npz")["scores"]
    width = int(np.prod(info.outputs[0].shape[1:]))
    if scores.shape != (len(rows), width):
        raise ConversionError(f"MediaPipe {TASKS[kind]} gave {scores.shape[1]} class scores per row; the model has "
                              f"{width}")
    runner = LitertRunner(model, info)
    same = np.concatenate([runner.run(r)[0].reshape(1, -1) for r in fed])  # run() dequantizes
    agree = float((scores.argmax(1) == same.argmax(1)).mean())
    out = {"client": f"{CLIENT} {TASKS[kind]}", "task": TASKS[kind], "rows": len(rows), **notes,
           "category_names": ans.get("category_names", [])[:8],
           "vs_runtime_same_raw": {"top1_agreement": agree, "max_abs": float(np.abs(scores - same).max(initial=0))}}
    reasons = []
    if agree < MIN_AGREEMENT:
        reasons.append(f"MediaPipe {TASKS[kind]} agrees with ai-edge-litert on the same raw rows on {agree:.1%} of "
                       f"top-1 classes (< {MIN_AGREEMENT:.0%}): the client reads the file differently")
    if task is not None:
        t = out["task_score"] = task.judge([scores], max_drop, f"{CLIENT} {TASKS[kind]}", bound_from)
        if not t["passed"]:
            clipped = notes.get("pixels_clipped_share", 0.0)
            hint = (f" ({clipped:.1%} of the rows' values fall outside 0..255 as pixels by --image mean "
                    f"{list(app.image.mean)} std {list(app.image.std)}: are those the model's?)" if clipped > CLIPPED_HINT
                    else "")
            reasons.append(f"through MediaPipe {TASKS[kind]}: {t['reason']}{hint}")
    if web:  # the web target's artifact also in MediaPipe Tasks for the web, in Chromium
        why = browser.browser_unavailable()
        if why:
            out["web"] = {"skipped": why}
        else:
            got = web_scores(model, kind, raw, app.audio.rate if app.audio else None, width)
            w = out["web"] = {"client": f"{WEB_CLIENT} {TASKS[kind]}", "top1_agreement_with_python":
                              float((got.argmax(1) == scores.argmax(1)).mean()),
                              "max_abs_vs_python": float(np.abs(got - scores).max(initial=0))}
            if w["top1_agreement_with_python"] < MIN_AGREEMENT:
                reasons.append(f"MediaPipe {TASKS[kind]} for the web agrees with its Python client on "
                               f"{w['top1_agreement_with_python']:.1%} of top-1 classes (< {MIN_AGREEMENT:.0%})")
            if task is not None:
                t = w["task_score"] = task.judge([got], max_drop, f"{WEB_CLIENT} {TASKS[kind]}", bound_from)
                if not t["passed"]:
                    reasons.append(f"through MediaPipe {TASKS[kind]} for the web: {t['reason']}")
    out["passed"] = not reasons
    if reasons:
        out["reason"] = reasons[0]
    return out
