"""Run in .venv-mediapipe (convert/app_io/worker.py): MediaPipe Tasks 1.2.2's own code, in a child.

Usage: python _mediapipe_worker.py REQUEST.json ANSWER.json. Imports only mediapipe, numpy and the
standard library (the parent runs it by file). Requests:
- {"op": "write", "model": IN, "out": OUT, "metadata": {...}, "files": {name: path}}: TFLite metadata
  built with MediaPipe's schema module (metadata_schema_py_generated), packed into the model by its
  MetadataPopulator with the associated files, then read back by its MetadataDisplayer (the
  flatbuffer parser in libmediapipe) -> {"json": the metadata as MediaPipe reads it, "files": [...]}.
- {"op": "classify", "task": "image"|"audio"|"text", "model": PATH, "rows": NPZ, "out": NPZ,
  "rate": HZ}: the MediaPipe task created from the file, each row classified through the task's
  own preprocessing -> OUT with `scores` (rows x classes, by category index) and {"classes": n}.

Why the metadata module needs a stand-in: mediapipe 1.2.2's wheel leaves out the
`mediapipe.tasks.cc.metadata.python._pywrap_metadata_version` extension that metadata.py imports
(issue 38). Its one function, GetMinimumMetadataParserVersion, is MediaPipe's rule (tasks/cc/
metadata/metadata_version.cc): the highest version among the schema members a buffer uses. The
stand-in applies that rule to the members this writer can use (MIN_VERSIONS); everything else is
MediaPipe's own code.
"""

import json
import sys
import time
import types

import numpy as np

# metadata_version.cc's member versions, for the members this writer uses (the rest stay 1.0.0)
MIN_VERSIONS = {"vocabulary_file": "1.0.1", "input_process_units": "1.1.0", "bert_tokenizer": "1.1.0",
                "sentencepiece_tokenizer": "1.1.0", "regex_tokenizer": "1.2.1", "audio_properties": "1.3.0"}
TOKENIZER_VERSIONS = {"RegexTokenizerOptions": "regex_tokenizer", "BertTokenizerOptions": "bert_tokenizer",
                      "SentencePieceTokenizerOptions": "sentencepiece_tokenizer"}


def _version_of(buf) -> str:
    from mediapipe.tasks.metadata import metadata_schema_py_generated as fb

    m = fb.ModelMetadataT.InitFromObj(fb.ModelMetadata.GetRootAsModelMetadata(bytes(buf), 0))
    used = set()
    for sub in m.subgraphMetadata or []:
        for t in (sub.inputTensorMetadata or []) + (sub.outputTensorMetadata or []):
            for f in t.associatedFiles or []:
                if f.type == fb.AssociatedFileType.VOCABULARY:
                    used.add("vocabulary_file")
            used.update(_tokenizers(fb, t.processUnits))
            if t.content is not None and t.content.contentPropertiesType == fb.ContentProperties.AudioProperties:
                used.add("audio_properties")
        if sub.inputProcessUnits:
            used.add("input_process_units")
            used.update(_tokenizers(fb, sub.inputProcessUnits))
    return max([MIN_VERSIONS[u] for u in used] + ["1.0.0"], key=lambda v: tuple(int(x) for x in v.split(".")))


def _tokenizers(fb, units) -> set:
    return {member for pu in units or [] for opt, member in TOKENIZER_VERSIONS.items()
            if pu.optionsType == getattr(fb.ProcessUnitOptions, opt)}


def _metadata_module():
    name = "mediapipe.tasks.cc.metadata.python._pywrap_metadata_version"
    if name not in sys.modules:
        stand_in = types.ModuleType(name)
        stand_in.GetMinimumMetadataParserVersion = _version_of
        for parent in ("mediapipe.tasks.cc", "mediapipe.tasks.cc.metadata", "mediapipe.tasks.cc.metadata.python"):
            sys.modules.setdefault(parent, types.ModuleType(parent))
        sys.modules[name] = stand_in
    from mediapipe.tasks.python.metadata import metadata

    return metadata


def _content(fb, kind: str, spec: dict):
    c = fb.ContentT()
    if kind == "image":
        c.contentPropertiesType = fb.ContentProperties.ImageProperties
        c.contentProperties = p = fb.ImagePropertiesT()
        p.colorSpace = fb.ColorSpaceType.RGB
    elif kind == "audio":
        c.contentPropertiesType = fb.ContentProperties.AudioProperties
        c.contentProperties = p = fb.AudioPropertiesT()
        p.sampleRate, p.channels = int(spec["rate"]), 1
    else:
        c.contentPropertiesType = fb.ContentProperties.FeatureProperties
        c.contentProperties = fb.FeaturePropertiesT()
    return c


def _file(fb, name: str, description: str, kind: int):
    f = fb.AssociatedFileT()
    f.name, f.description, f.type = name, description, kind
    return f


def _stats(fb, lo, hi):
    s = fb.StatsT()
    s.min, s.max = list(lo), list(hi)
    return s


BERT_INPUTS = {"ids": "Tokenized ids of the input text.",
               "mask": "Mask with 1 for real tokens and 0 for padding tokens.",
               "segment_ids": "0 for the first sequence, 1 for the second sequence if exists."}


def _bert_inputs(fb, inp: dict, n_inputs: int) -> list:
    """One TensorMetadata per input at its subgraph position, named as MediaPipe's BERT preprocessor finds them."""
    tensors = [None] * n_inputs
    for role, description in BERT_INPUTS.items():
        t = tensors[inp["positions"][role]] = fb.TensorMetadataT()
        t.name, t.description = role, description
        t.content = _content(fb, "feature", inp)
    return tensors


def _bert_tokenizer(fb, tokenizer: str, file: str):
    """BertTokenizerOptions with the WordPiece vocab, or SentencePieceTokenizerOptions with the model file
    (as MediaPipe's BertTokenizerMd / SentencePieceTokenizerMd write them)."""
    tok = fb.ProcessUnitT()
    if tokenizer == "sentencepiece":
        tok.optionsType = fb.ProcessUnitOptions.SentencePieceTokenizerOptions
        tok.options = fb.SentencePieceTokenizerOptionsT()
        tok.options.sentencePieceModel = [_file(fb, file, "The sentence piece model file.", fb.AssociatedFileType.UNKNOWN)]
        return tok
    tok.optionsType = fb.ProcessUnitOptions.BertTokenizerOptions
    tok.options = fb.BertTokenizerOptionsT()
    tok.options.vocabFile = [_file(fb, file, "WordPiece vocabulary: one token a line, line index = id",
                                   fb.AssociatedFileType.VOCABULARY)]
    return tok


def build(req: dict) -> bytes:
    from mediapipe.tasks.metadata import metadata_schema_py_generated as fb
    import flatbuffers

    meta = req["metadata"]
    inp, out = meta["input"], meta["output"]
    tin = fb.TensorMetadataT()
    tin.name, tin.description = inp["name"], inp["description"]
    if inp["kind"] is not None:
        tin.content = _content(fb, inp["kind"], inp)
    if inp["kind"] == "image":
        norm = fb.ProcessUnitT()
        norm.optionsType = fb.ProcessUnitOptions.NormalizationOptions
        norm.options = fb.NormalizationOptionsT()
        norm.options.mean, norm.options.std = list(inp["mean"]), list(inp["std"])
        tin.processUnits = [norm]
        tin.stats = _stats(fb, inp["min"], inp["max"])
    sub = fb.SubGraphMetadataT()
    if inp["kind"] == "text":
        tok = fb.ProcessUnitT()
        tok.optionsType = fb.ProcessUnitOptions.RegexTokenizerOptions
        tok.options = fb.RegexTokenizerOptionsT()
        tok.options.delimRegexPattern = inp["delimiter"]
        tok.options.vocabFile = [_file(fb, inp["vocab_file"], "Vocabulary: \"token id\" lines",
                                       fb.AssociatedFileType.VOCABULARY)]
        tin.processUnits = [tok]  # on the input tensor, as MediaPipe's text classifier writer puts it
    inputs = [tin] + [fb.TensorMetadataT() for _ in range(req.get("n_inputs", 1) - 1)]
    if inp["kind"] == "bert":  # MediaPipe's text classifier writer: the tokenizer on the subgraph, three named inputs
        inputs = _bert_inputs(fb, inp, req["n_inputs"])
        sub.inputProcessUnits = [_bert_tokenizer(fb, inp["tokenizer"], inp["vocab_file"])]
    tout = fb.TensorMetadataT()
    tout.name, tout.description = out["name"], out["description"]
    tout.content = _content(fb, "feature", out)
    if out.get("labels_file"):
        tout.associatedFiles = [_file(fb, out["labels_file"], "Labels, one per line, index = class",
                                      fb.AssociatedFileType.TENSOR_AXIS_LABELS)]
    if out.get("probabilities"):
        tout.stats = _stats(fb, [0.0], [1.0])
    # one TensorMetadata per subgraph tensor (MetadataPopulator checks the counts): the described input
    # and the labelled output at their positions, the others bare (a labels-only model of several inputs)
    sub.inputTensorMetadata = inputs
    sub.outputTensorMetadata = [fb.TensorMetadataT() for _ in range(req.get("n_outputs", 1))]
    sub.outputTensorMetadata[req.get("output_position", 0)] = tout
    m = fb.ModelMetadataT()
    for key, attr in (("name", "name"), ("description", "description"), ("version", "version"),
                      ("author", "author"), ("license", "license")):
        if meta.get(key):
            setattr(m, attr, meta[key])
    m.subgraphMetadata = [sub]
    b = flatbuffers.Builder(0)
    b.Finish(m.Pack(b), b"M001")
    return bytes(b.Output())


def write(req: dict) -> dict:
    metadata = _metadata_module()
    with open(req["model"], "rb") as f:
        model = f.read()
    pop = metadata.MetadataPopulator.with_model_buffer(model)
    pop.load_metadata_buffer(build(req))
    if req["files"]:
        pop.load_associated_files(list(req["files"].values()))
    pop.populate()
    written = pop.get_model_buffer()
    del pop  # its __del__ removes a temporary file: now, not at interpreter exit (where it fails)
    with open(req["out"], "wb") as f:
        f.write(written)
    shown = metadata.MetadataDisplayer.with_model_buffer(written)  # MediaPipe's reader, on the bytes that ship
    return {"json": json.loads(shown.get_metadata_json()), "files": shown.get_packed_associated_file_list()}


_SECONDS: list = []


def _timed(fn):
    """fn() -> its result; its wall time is kept (the answer's median ms per classify call: the
    client's preprocessing and the model together)."""
    t = time.perf_counter()
    out = fn()
    _SECONDS.append(time.perf_counter() - t)
    return out


def classify(req: dict) -> dict:
    from mediapipe.tasks.python.core.base_options import BaseOptions

    rows = np.load(req["rows"])
    with open(req["model"], "rb") as f:
        base = BaseOptions(model_asset_buffer=f.read())
    task = req["task"]
    results = []
    if task == "image":
        import mediapipe as mp
        from mediapipe.tasks.python import vision

        with vision.ImageClassifier.create_from_options(
                vision.ImageClassifierOptions(base_options=base, max_results=-1)) as clf:
            for pix in rows["pixels"]:
                img = mp.Image(image_format=mp.ImageFormat.SRGB, data=np.ascontiguousarray(pix))
                results.append(_timed(lambda: clf.classify(img).classifications[0].categories))
    elif task == "audio":
        from mediapipe.tasks.python import audio
        from mediapipe.tasks.python.components.containers import audio_data

        with audio.AudioClassifier.create_from_options(
                audio.AudioClassifierOptions(base_options=base, max_results=-1)) as clf:
            for wav in rows["waveforms"]:
                clip = audio_data.AudioData.create_from_array(wav.astype(np.float32), req["rate"])
                results.append(_timed(lambda: clf.classify(clip)[0].classifications[0].categories))
    else:
        from mediapipe.tasks.python import text

        with text.TextClassifier.create_from_options(
                text.TextClassifierOptions(base_options=base, max_results=-1)) as clf:
            for sentence in req["texts"]:
                results.append(_timed(lambda: clf.classify(sentence).classifications[0].categories))
    n = 1 + max((c.index for cats in results for c in cats), default=-1)
    scores = np.zeros((len(results), n), np.float32)
    names = [""] * n
    for i, cats in enumerate(results):
        for c in cats:
            scores[i, c.index] = c.score
            names[c.index] = c.category_name or ""
    np.savez(req["out"], scores=scores)
    return {"classes": n, "category_names": names, "ms_per_call": 1000 * float(np.median(_SECONDS))}


def main(request_path: str, answer_path: str) -> None:
    with open(request_path) as f:
        req = json.load(f)
    try:
        answer = write(req) if req["op"] == "write" else classify(req)
    except Exception as e:  # noqa: BLE001 - the parent reports it in one line
        msg = str(e).strip().splitlines()
        answer = {"error": f"{type(e).__name__}: {msg[0] if msg else ''}"[:500]}
    with open(answer_path, "w") as f:
        json.dump(answer, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
