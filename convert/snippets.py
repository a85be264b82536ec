"""Loader snippets for app developers (Kotlin for android, Swift for ios),
filled in with the artifact's real input/output names, shapes and dtypes
from model.json. Text to paste into an app, not a built app.

A language model's target (model.json with a `litertlm` bundle) gets an LM
snippet instead: LlmRunner.kt / LlmRunner.swift run the bundle with
LiteRT-LM's Kotlin / Swift API (Engine, Conversation), filled in with the
bundle's file name, its KV-cache length and the sampler defaults written into
the bundle (model.json's litertlm.sampler)."""

from __future__ import annotations

import math
import re
import string
from pathlib import Path

TEMPLATES = Path(__file__).parent / "snippets"
SNIPPET_FILES = {"kotlin": ("android.kt.tmpl", "ModelRunner.kt"), "swift": ("ios.swift.tmpl", "ModelRunner.swift"),
                 "kotlin-npu": ("android_npu.kt.tmpl", "ModelRunner.kt")}  # android-npu: NPU, then GPU, then CPU
LM_SNIPPET_FILES = {"kotlin": ("android_lm.kt.tmpl", "LlmRunner.kt"), "swift": ("ios_lm.swift.tmpl", "LlmRunner.swift")}
# dtype -> (Kotlin array, TensorBuffer write, read) and (Swift element type)
KOTLIN = {"float32": ("FloatArray", "writeFloat", "readFloat"), "int32": ("IntArray", "writeInt", "readInt"),
          "int8": ("ByteArray", "writeInt8", "readInt8")}
SWIFT = {"float32": "Float32", "int32": "Int32", "int8": "Int8", "uint8": "UInt8"}


def _ident(name: str, i: int) -> str:
    words = [w for w in re.split(r"[^0-9A-Za-z]+", name) if w]
    ident = words[0].lower() + "".join(w.capitalize() for w in words[1:]) if words else f"input{i}"
    return ident if ident[0].isalpha() else f"x{ident}"


def _doc(prefix: str, kind: str, t: dict) -> str:
    q = t.get("quantization") or {}
    quant = f", scale {q['scale']:.6g}, zero point {q['zero_point']}" if q.get("scale") else ""
    return f"    {prefix} {kind} {t['name']!r}: shape {list(t['shape'])}, {t['dtype']}{quant}"


def render(language: str, model_json: dict, model_name: str) -> str:
    tmpl_name, _ = SNIPPET_FILES[language]
    ins, outs = model_json["inputs"], model_json["outputs"]
    names = [_ident(t["name"], i) for i, t in enumerate(ins)]
    docs = [_doc("//", "input", t) for t in ins] + [_doc("//", "output", t) for t in outs]
    if language.startswith("kotlin"):
        params = ", ".join(f"{n}: {KOTLIN[t['dtype']][0]}" for n, t in zip(names, ins))
        writes = "\n".join(f"        require({n}.size == {math.prod(t['shape'])})\n"
                           f"        inputs[{i}].{KOTLIN[t['dtype']][1]}({n})"
                           for i, (n, t) in enumerate(zip(names, ins)))
        reads_list = [f"outputs[{j}].{KOTLIN[t['dtype']][2]}()" for j, t in enumerate(outs)]
        types = [KOTLIN[t["dtype"]][0] for t in outs]
        return_type = types[0] if len(types) == 1 else "List<Any>"
        reads = reads_list[0] if len(reads_list) == 1 else f"listOf({', '.join(reads_list)})"
    else:
        params = ", ".join(f"{'_ ' if i == 0 else ''}{n}: [{SWIFT[t['dtype']]}]" for i, (n, t) in enumerate(zip(names, ins)))
        writes = "\n".join(f"        precondition({n}.count == {math.prod(t['shape'])})\n"
                           f"        try interpreter.copy({n}.withUnsafeBufferPointer {{ Data(buffer: $0) }}, toInputAt: {i})"
                           for i, (n, t) in enumerate(zip(names, ins)))
        types = [f"[{SWIFT[t['dtype']]}]" for t in outs]
        return_type = types[0] if len(types) == 1 else f"({', '.join(types)})"
        lines = [f"        let out{j} = try interpreter.output(at: {j}).data.withUnsafeBytes "
                 f"{{ Array($0.bindMemory(to: {SWIFT[t['dtype']]}.self)) }}" for j, t in enumerate(outs)]
        ret = "out0" if len(outs) == 1 else f"({', '.join(f'out{j}' for j in range(len(outs)))})"
        reads = "\n".join(lines + [f"        return {ret}"])
    text = string.Template((TEMPLATES / tmpl_name).read_text())
    return text.substitute(model=model_name, target=model_json.get("target", ""), quantization=model_json["quantization"],
                           class_name="ModelRunner", input_docs="\n".join(docs), params=params,
                           return_type=return_type, writes=writes, reads=reads)


def _sampler(sampler: dict | None) -> tuple[str, str, str]:
    """(comment, Kotlin expression, Swift expression) for the bundle's sampler defaults."""
    if not sampler:
        return ("The bundle carries no sampler defaults: none is passed, so LiteRT-LM uses its engine's own.", "null", "nil")
    k, p, t, seed = sampler["top_k"], float(sampler["top_p"]), float(sampler["temperature"]), sampler["seed"]
    doc = (f"Sampler defaults written into the bundle (its LLM metadata): {sampler['type']}, top_k {k}, "
           f"top_p {p:g}, temperature {t:g}, seed {seed}"
           + (" (greedy: the decoding convert's parity checked)." if k == 1 else "."))
    return (doc, f"SamplerConfig(topK = {k}, topP = {p!r}, temperature = {t!r}, seed = {seed})",
            f"try? SamplerConfig(topK: {k}, topP: {p!r}, temperature: {t!r}, seed: {seed})")


def render_lm(language: str, model_json: dict, model_name: str) -> str:
    """The LiteRT-LM snippet for an LM target's model.json (its `litertlm` entry)."""
    tmpl_name, _ = LM_SNIPPET_FILES[language]
    bundle = model_json["litertlm"]
    doc, kotlin, swift = _sampler(bundle.get("sampler"))
    stem, _, ext = bundle["file"].rpartition(".")
    text = string.Template((TEMPLATES / tmpl_name).read_text())
    return text.substitute(model=model_name, target=model_json.get("target", ""),
                           quantization=model_json["quantization"], class_name="LlmRunner", bundle=bundle["file"],
                           bundle_stem=stem, bundle_ext=ext, max_num_tokens=bundle["cache_length"],
                           sampler_doc=doc, kotlin_sampler=kotlin, swift_sampler=swift)


# An app-ready artifact (model.json's `app`, convert/app_io): the MediaPipe task created from the file.
MEDIAPIPE_FILES = {"kotlin": ("mediapipe.kt.tmpl", "Model{task}.kt"), "swift": ("mediapipe.swift.tmpl", "Model{task}.swift"),
                   "js": ("mediapipe.js.tmpl", "model_{task}.js")}
# per task: what the metadata carries, the packages, and each language's input and call
MEDIAPIPE_TASKS = {
    "ImageClassifier": {
        "reads": "the image size, (pixel - mean) / std and the labels", "artifact": "tasks-vision",
        "pod": "MediaPipeTasksVision", "npm": "@mediapipe/tasks-vision", "fileset": "forVisionTasks",
        "imports": "import android.graphics.Bitmap\nimport com.google.mediapipe.framework.image.BitmapImageBuilder\n"
                   "import com.google.mediapipe.tasks.vision.imageclassifier.ImageClassifier",
        "swift_imports": "import UIKit\n",
        "kotlin_param": "bitmap: Bitmap", "swift_param": "_ image: UIImage", "js_param": "image",
        "kotlin_body": "        val result = classifier.classify(BitmapImageBuilder(bitmap).build())\n"
                       "        return result.classificationResult().classifications()[0].categories()",
        "swift_body": "        let result = try classifier.classify(image: try MPImage(uiImage: image))\n"
                      "        return result.classificationResult.classifications[0].categories",
        "js_call": "classifier.classify(image)",
        "input_doc": "An RGB image of any size (the task resizes it to {size}): a camera frame, a photo."},
    "AudioClassifier": {
        "reads": "the sample rate and the labels", "artifact": "tasks-audio", "pod": "MediaPipeTasksAudio",
        "npm": "@mediapipe/tasks-audio", "fileset": "forAudioTasks",
        "imports": "import com.google.mediapipe.tasks.audio.audioclassifier.AudioClassifier\n"
                   "import com.google.mediapipe.tasks.components.containers.AudioData",
        "swift_imports": "import AVFoundation\n",
        "kotlin_param": "samples: FloatArray", "swift_param": "_ buffer: AVAudioPCMBuffer", "js_param": "samples",
        "kotlin_body": "        val audio = AudioData.create(\n"
                       "            AudioData.AudioDataFormat.builder().setNumOfChannels(1).setSampleRate({rate}f).build(),\n"
                       "            samples.size)\n"
                       "        audio.load(samples)\n"
                       "        return classifier.classify(audio).classificationResults()[0].classifications()[0].categories()",
        "swift_body": "        let audio = AudioData(format: AudioDataFormat(channelCount: 1, sampleRate: {rate}),\n"
                      "                              sampleCount: UInt(buffer.frameLength))\n"
                      "        try audio.load(buffer: buffer, offset: 0, count: UInt(buffer.frameLength))\n"
                      "        return try classifier.classify(audioClip: audio).classificationResults[0]"
                      ".classifications[0].categories",
        "js_call": "classifier.classify(samples, {rate})[0]",
        "input_doc": "Mono samples in -1..1 at {rate} Hz (other rates are resampled), {samples} per result."},
    "TextClassifier": {
        "reads": "the regex tokenizer with its vocab and the labels", "artifact": "tasks-text",
        "pod": "MediaPipeTasksText", "npm": "@mediapipe/tasks-text", "fileset": "forTextTasks",
        "imports": "import com.google.mediapipe.tasks.text.textclassifier.TextClassifier", "swift_imports": "",
        "kotlin_param": "text: String", "swift_param": "_ text: String", "js_param": "text",
        "kotlin_body": "        return classifier.classify(text).classificationResult().classifications()[0].categories()",
        "swift_body": "        return try classifier.classify(text: text).classificationResult.classifications[0].categories",
        "js_call": "classifier.classify(text)",
        "input_doc": "A sentence: the task tokenizes it ({length} tokens, padded or cut)."},
}


def render_mediapipe(language: str, model_json: dict, model_name: str) -> str:
    """The snippet that creates model.json's MediaPipe task (its `app`) from the file."""
    app, t = model_json["app"], MEDIAPIPE_TASKS[model_json["app"]["task"]]
    shape = model_json["inputs"][0]["shape"]
    fill = {"size": f"{shape[2]} x {shape[1]}" if len(shape) == 4 else "", "rate": (app.get("audio") or {}).get("sample_rate"),
            "samples": shape[-1], "length": shape[-1]}
    code = {k: v.format(**fill) if "{" in v else v for k, v in t.items()}
    probs = "is a probability (softmax head)" if app.get("labels") else "is the model's score"
    text = string.Template((TEMPLATES / MEDIAPIPE_FILES[language][0]).read_text())
    return text.substitute(model=model_name, target=model_json.get("target", ""), quantization=model_json["quantization"],
                           task=app["task"], class_name=f"Model{app['task']}", classes=len(app.get("labels") or []) or -1, score_doc=probs, **code)


def write_snippet(language: str, model_json: dict, out_dir: str | Path, model_name: str) -> Path | None:
    """language: a target profile's `app_snippet` ("" writes nothing; "js": the web target, only for a
    MediaPipe task). An LM target (model.json with a `litertlm` bundle) gets the LiteRT-LM snippet; an
    app-ready one (model.json's `app` names a task) the MediaPipe task; any other the LiteRT loader."""
    if not language:
        return None
    task = (model_json.get("app") or {}).get("task")
    if task and language in MEDIAPIPE_FILES:
        path = Path(out_dir) / MEDIAPIPE_FILES[language][1].format(task=task)
        path.write_text(render_mediapipe(language, model_json, model_name))
        return path
    if language == "js":
        return None
    if model_json.get("litertlm"):
        path = Path(out_dir) / LM_SNIPPET_FILES[language][1]
        path.write_text(render_lm(language, model_json, model_name))
        return path
    path = Path(out_dir) / SNIPPET_FILES[language][1]
    path.write_text(render(language, model_json, model_name))
    return path
