"""The input description: what an app hands the model (an RGB image, a mono
waveform, a sentence) and what its scores mean (labels), said once and read
by every step that faces the app: the app graph (graph.py), the TFLite
metadata (metadata.py), the MediaPipe client check (client.py), model.json
and the snippets.

Records are typed and frozen; `parse_*` read the flag strings
(`--image x:mean=127.5:std=127.5`, `--audio wav:rate=16000`,
`--text ids:vocab=vocab.txt`, `--labels labels.txt`) into them. `describe`
resolves the records against the model's inputs and outputs (which input,
its layout, the class count) and raises UserError (exit 2) with one line
on anything that cannot work, before anything is written."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Sequence

from tpu_pipeline.convert.app_io import unigram, wordpiece
from tpu_pipeline.errors import UserError

# MediaPipe's RegexTokenizer conventions (metadata_schema.fbs RegexTokenizerOptions; Model Maker's
# average-word-embedding text classifier): these three tokens must be in the vocab
PAD, START, UNKNOWN = "<PAD>", "<START>", "<UNKNOWN>"
REGEX_DELIMITER = r"[^\w\']+"
TOKENIZERS = ("regex", "bert", "sentencepiece")  # what this version writes into metadata
BERT_MASK, BERT_SEGMENT = "attention_mask", "token_type_ids"  # Hugging Face's names: the default mask and segment inputs
METADATA_KEYS = ("name", "description", "version", "author", "license")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ImageInput:
    """An RGB image input. MediaPipe's NormalizationOptions convention: model input =
    (pixel - mean) / std, pixel in 0..255; one value or one per channel (R, G, B)."""

    name: str                            # the model input (input_names / forward() argument)
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (255.0,)
    layout: str | None = None            # NCHW | NHWC as PyTorch takes it; None: found from the 3-sized axis


@dataclasses.dataclass(frozen=True, kw_only=True)
class AudioInput:
    """A mono waveform in -1..1 at `rate` Hz (MediaPipe AudioProperties: sample_rate, channels 1)."""

    name: str
    rate: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class TextInput:
    """Token ids of a sentence. regex: MediaPipe's RegexTokenizer, `vocab` holds "token id" lines
    with <PAD> 0, <START> and <UNKNOWN>; the sentence is split on `delimiter`, started with <START>
    and padded with <PAD> to the input's length. bert: MediaPipe's BERT (WordPiece) preprocessing
    (wordpiece.py), `vocab` a tokenizer.json or a vocab.txt of one token a line; sentencepiece:
    the same preprocessing with a SentencePiece model (unigram.py), `vocab` a Unigram tokenizer.json.
    Both fill three inputs of one length: token ids (`name`), attention mask (`mask`) and segment ids
    (`segment`), by default Hugging Face's attention_mask and token_type_ids. MediaPipe feeds int32: a model taking int64
    ids gets them cast inside the app graph (`cast_to`, set by describe)."""

    name: str
    vocab: Path
    tokenizer: str = "regex"
    delimiter: str = REGEX_DELIMITER
    mask: str | None = None
    segment: str | None = None
    cast_to: str | None = None           # the PyTorch model's id dtype when it is not int32 (describe sets it)

    @property
    def bert_style(self) -> bool:
        """MediaPipe's BERT preprocessing: [CLS] pieces [SEP] into ids, mask and segment ids."""
        return self.tokenizer != "regex"

    @property
    def names(self) -> tuple[str, ...]:
        """The model inputs the tokenizer fills: ids (regex); ids, mask, segment ids (bert, sentencepiece)."""
        return (self.name, self.mask or BERT_MASK, self.segment or BERT_SEGMENT) if self.bert_style else (self.name,)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Labels:
    """Class names, index = class (the score output's last axis)."""

    names: tuple[str, ...]
    source: str                          # a file path, "manifest" or "python"


@dataclasses.dataclass(frozen=True, kw_only=True)
class AppIO:
    """One model's app-facing description, resolved against it (describe()): at most one of
    image/audio/text (the task's input), labels for its first output, the metadata's
    name/description/version/author/license."""

    image: ImageInput | None = None
    audio: AudioInput | None = None
    text: TextInput | None = None
    labels: Labels | None = None
    info: dict[str, str] = dataclasses.field(default_factory=dict)
    input_names: tuple[str, ...] = ()    # the model's inputs in order (describe sets them)

    @property
    def input(self) -> ImageInput | AudioInput | TextInput | None:
        return self.image or self.audio or self.text

    @property
    def task(self) -> str | None:
        """The MediaPipe task an app creates from the file."""
        return ("ImageClassifier" if self.image else "AudioClassifier" if self.audio else
                "TextClassifier" if self.text else None)


def _pairs(spec: str, flag: str, allowed: Sequence[str], required: tuple[str, str] | None = None
           ) -> tuple[str, dict[str, str]]:
    """`NAME:key=value:key=value` -> (NAME, {key: value}); required: (key, what it is, like
    "the sample rate"), the first allowed key's example value."""
    name, *rest = spec.split(":")
    if not name or "=" in name:
        raise UserError(f"{flag} {spec!r}: expected NAME first (the model input), like {flag} x:{allowed[0]}=...")
    out = {}
    for part in rest:
        key, eq, value = part.partition("=")
        if not eq or key not in allowed:
            raise UserError(f"{flag} {spec!r}: {part!r} is not one of {', '.join(k + '=...' for k in allowed)}")
        out[key] = value
    if required and required[0] not in out:
        raise UserError(f"{flag} {spec!r}: give {required[1]}, like {flag} {name}:{required[0]}=...")
    return name, out


def _floats(value: str, what: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(v) for v in value.split(","))
    except ValueError:
        raise UserError(f"{what} {value!r}: expected a number or three comma-separated numbers (R,G,B)") from None
    if len(vals) not in (1, 3):
        raise UserError(f"{what} {value!r}: one value or one per channel (3), not {len(vals)}")
    return vals


def parse_image(spec: str | ImageInput) -> ImageInput:
    if isinstance(spec, ImageInput):
        img = spec
    else:
        name, kv = _pairs(spec, "--image", ("mean", "std"))
        img = ImageInput(name=name, **{k: _floats(v, f"--image {k}") for k, v in kv.items()})
    if any(s == 0 for s in img.std):
        raise UserError(f"--image {img.name}: std must not be 0 (model input = (pixel - mean) / std)")
    if img.layout not in (None, "NCHW", "NHWC"):
        raise UserError(f"--image {img.name}: layout {img.layout!r} is not NCHW or NHWC")
    return img


def parse_audio(spec: str | AudioInput) -> AudioInput:
    if isinstance(spec, AudioInput):
        aud = spec
    else:
        name, kv = _pairs(spec, "--audio", ("rate",), ("rate", "the sample rate in Hz"))
        try:
            aud = AudioInput(name=name, rate=int(kv["rate"]))
        except ValueError:
            raise UserError(f"--audio {spec!r}: rate {kv['rate']!r} is not a whole number of Hz") from None
    if aud.rate <= 0:
        raise UserError(f"--audio {aud.name}: rate must be a positive number of Hz, not {aud.rate}")
    return aud


def parse_text(spec: str | TextInput) -> TextInput:
    if isinstance(spec, TextInput):
        txt = spec
    else:
        name, kv = _pairs(spec, "--text", TEXT_KEYS, ("vocab", "the tokenizer vocab file"))
        txt = TextInput(name=name, vocab=Path(kv.pop("vocab")), **kv)
    if txt.tokenizer not in TOKENIZERS:
        raise UserError(f"--text {txt.name}: tokenizer {txt.tokenizer!r} is not one of {', '.join(TOKENIZERS)}")
    if txt.bert_style:
        tokenizer_file(txt)
    else:
        read_vocab(txt)
    return txt


def tokenizer_file(txt: TextInput) -> tuple[str, bytes, wordpiece.Vocab]:
    """A BERT-style input's tokenizer as MediaPipe reads it -> (the associated file's name, its bytes,
    the vocab): bert's WordPiece vocab one token a line, sentencepiece's serialized model."""
    what = f"--text {txt.name}"
    if txt.tokenizer == "sentencepiece":
        model, vocab = unigram.read(txt.vocab, what)
        return "sentencepiece.model", model, vocab
    vocab = wordpiece.read(txt.vocab, what)
    return "vocab.txt", ("\n".join(vocab.tokens) + "\n").encode("utf-8"), vocab


TEXT_KEYS = ("vocab", "tokenizer", "mask", "segment")  # --text NAME:vocab=FILE[:tokenizer=bert][:mask=..][:segment=..]


def read_vocab(txt: TextInput) -> dict[str, int]:
    """The regex tokenizer's vocab file -> {token: id}; one line per token, "token id"."""
    try:
        lines = Path(txt.vocab).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--text {txt.name}: cannot read vocab {txt.vocab} ({type(e).__name__}: {e})") from None
    vocab = {}
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not re.fullmatch(r"\d+", parts[1]):
            raise UserError(f"--text {txt.name}: vocab {txt.vocab} line {i} is {line!r}, not \"token id\"")
        vocab[parts[0]] = int(parts[1])
    missing = [t for t in (PAD, START, UNKNOWN) if t not in vocab]
    if missing:
        raise UserError(f"--text {txt.name}: vocab {txt.vocab} lacks {', '.join(missing)} (MediaPipe's regex "
                        "tokenizer needs <PAD>, <START> and <UNKNOWN>)")
    return vocab


def parse_labels(spec: str | Path | Sequence[str] | Labels) -> Labels:
    if isinstance(spec, Labels):
        return spec
    if isinstance(spec, (str, Path)):
        try:
            names = Path(spec).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"--labels {spec}: cannot read it ({type(e).__name__}: {e})") from None
        while names and not names[-1].strip():
            names.pop()
        labels = Labels(names=tuple(n.strip() for n in names), source=str(spec))
    else:
        labels = Labels(names=tuple(str(n) for n in spec), source="python")
    if not labels.names or any(not n for n in labels.names):
        raise UserError(f"--labels {labels.source}: one label per line, none empty "
                        f"({len(labels.names)} lines read)")
    return labels


def parse_info(spec: dict[str, str] | Sequence[str] | None) -> dict[str, str]:
    """--metadata KEY=VALUE (repeated) or a dict -> {key: value}; keys METADATA_KEYS."""
    items = (spec or {}).items() if isinstance(spec, dict) or spec is None else [
        s.partition("=")[::2] if "=" in s else (s, None) for s in spec]
    out = {}
    for key, value in items:
        if key not in METADATA_KEYS or value is None:
            raise UserError(f"--metadata {key}{'' if value is None else '=' + value}: expected KEY=VALUE with KEY one of "
                            f"{', '.join(METADATA_KEYS)}")
        out[key] = str(value)
    return out


def describe(*, image=None, audio=None, text=None, labels=None, info=None, given: AppIO | None = None,
             input_names: Sequence[str], input_shapes: Sequence[tuple[int, ...]], input_dtypes: Sequence[str],
             output_shapes: Sequence[tuple[int, ...]]) -> AppIO | None:
    """The options (flag strings or records) over `given` (a manifest's or a loader's description),
    resolved against the model: which input, its layout, the class count. None when nothing is
    described. One line (UserError) for anything that cannot work."""
    g = given or AppIO()
    img = parse_image(image) if image is not None else g.image
    aud = parse_audio(audio) if audio is not None else g.audio
    txt = parse_text(text) if text is not None else g.text
    lab = parse_labels(labels) if labels is not None else g.labels
    meta = {**g.info, **parse_info(info)}
    if img is None and aud is None and txt is None and lab is None:
        if meta:
            raise UserError("--metadata describes an app-ready artifact: give --image, --audio, --text or --labels too")
        return None
    said = [f for f, v in (("--image", img), ("--audio", aud), ("--text", txt)) if v is not None]
    if len(said) > 1:
        raise UserError(f"{said[0]} and {said[1]}: an artifact has one app input (one MediaPipe task)")
    bert = txt is not None and txt.bert_style
    if said and not bert and len(input_names) != 1:
        raise UserError(f"{said[0]}: MediaPipe's classifiers take one input; this model takes {len(input_names)} "
                        f"({', '.join(input_names)})")
    if said and len(output_shapes) != 1:
        raise UserError(f"{said[0]}: MediaPipe's classifiers read every output as a head of class scores; this "
                        f"model has {len(output_shapes)} outputs")
    dims = dict(zip(input_names, zip(input_shapes, input_dtypes)))
    spec = img or aud or txt
    if spec is not None and spec.name not in dims:
        raise UserError(f"{said[0]} {spec.name}: the model has no input of that name (inputs: {', '.join(input_names)})")
    if img is not None:
        img = dataclasses.replace(img, layout=_image_layout(img, *dims[img.name]))
    if aud is not None:
        shape, dtype = dims[aud.name]
        if len(shape) != 2 or shape[0] != 1 or not dtype.startswith("float"):
            raise UserError(f"--audio {aud.name}: a mono waveform input is float [1, samples]; this one is {dtype} "
                            f"{list(shape)}")
    if txt is not None:
        txt = _text_inputs(txt, dims, input_names)
    if lab is not None:
        head = output_shapes[0] if output_shapes else ()
        if len(head) != 2 or head[0] != 1:
            raise UserError(f"--labels {lab.source}: labels name the classes of a [1, classes] output; the first "
                            f"output is {list(head)}")
        if len(lab.names) != head[1]:
            raise UserError(f"--labels {lab.source}: {len(lab.names)} labels for {head[1]} classes (the first "
                            f"output's last axis)")
    return AppIO(image=img, audio=aud, text=txt, labels=lab, info=meta, input_names=tuple(input_names))


def _text_inputs(txt: TextInput, dims: dict, input_names: Sequence[str]) -> TextInput:
    """The tokenizer's inputs checked against the model: integer [1, length], one length; the
    dtype to cast MediaPipe's int32 to when the model takes another."""
    if txt.bert_style and (len(input_names) != 3 or set(txt.names) != set(input_names)):
        raise UserError(f"--text {txt.name}: MediaPipe's BERT preprocessing fills three inputs (ids {txt.names[0]}, "
                        f"mask {txt.names[1]}, segment ids {txt.names[2]}); the model takes {', '.join(input_names)} "
                        "(say the others with mask=NAME, segment=NAME)")
    for n in txt.names:
        shape, dtype = dims[n]
        if len(shape) != 2 or shape[0] != 1 or dtype.startswith(("float", "bool", "complex")):
            raise UserError(f"--text {n}: token ids are an integer [1, length] input; this one is {dtype} "
                            f"{list(shape)}")
    lengths = {dims[n][0][1] for n in txt.names}
    if len(lengths) != 1:
        raise UserError(f"--text {txt.name}: {', '.join(txt.names)} have lengths {sorted(lengths)}; MediaPipe "
                        "feeds them one length")
    dtype = dims[txt.name][1]
    return dataclasses.replace(txt, cast_to=None if dtype == "int32" else dtype)


def _image_layout(img: ImageInput, shape: tuple[int, ...], dtype: str) -> str:
    if len(shape) != 4 or shape[0] != 1 or not dtype.startswith("float"):
        raise UserError(f"--image {img.name}: an image input is float [1, 3, H, W] or [1, H, W, 3]; this one is "
                        f"{dtype} {list(shape)}")
    found = [lay for lay, axis in (("NCHW", 1), ("NHWC", 3)) if shape[axis] == 3]
    if img.layout is not None:
        if img.layout not in found:
            raise UserError(f"--image {img.name}: layout {img.layout} needs 3 channels on axis "
                            f"{1 if img.layout == 'NCHW' else 3}; the input is {list(shape)}")
        return img.layout
    if not found:
        raise UserError(f"--image {img.name}: an RGB input has a 3-sized channel axis; this one is {list(shape)} "
                        "(a grayscale or other input is not an image MediaPipe can feed)")
    if len(found) == 2:
        raise UserError(f"--image {img.name}: {list(shape)} has 3 on both axis 1 and 3; say the layout "
                        "(Python: ImageInput(layout='NCHW'))")
    for what, vals in (("mean", img.mean), ("std", img.std)):
        if len(vals) not in (1, 3):
            raise UserError(f"--image {img.name}: {what} takes one value or one per channel")
    return found[0]


MANIFEST_KEYS = ("image", "audio", "text", "labels", "metadata")


def from_manifest(d: dict, folder: Path, where: str) -> AppIO:
    """A model.pt manifest's `app_io` object -> AppIO (not yet checked against the model: describe
    does): image/audio/text as the flags take them, labels a list of names or a file, metadata an
    object; files relative to the manifest's folder."""
    if not isinstance(d, dict) or set(d) - set(MANIFEST_KEYS):
        raise UserError(f"{where}: manifest field 'app_io' takes {', '.join(MANIFEST_KEYS)}")
    for key in ("image", "audio", "text"):
        if d.get(key) is not None and not isinstance(d[key], str):
            raise UserError(f"{where}: app_io.{key} is a string as --{key} takes it")
    txt = None
    if d.get("text") is not None:
        name, kv = _pairs(d["text"], "--text", TEXT_KEYS, ("vocab", "the tokenizer vocab file"))
        txt = parse_text(TextInput(name=name, vocab=folder / kv.pop("vocab"), **kv))
    labels = d.get("labels")
    if isinstance(labels, str):
        labels = folder / labels
    elif labels is not None and not (isinstance(labels, list) and all(isinstance(n, str) for n in labels)):
        raise UserError(f"{where}: app_io.labels is a list of names or a file")
    lab = parse_labels(labels) if labels is not None else None
    if lab is not None and not isinstance(labels, Path):
        lab = dataclasses.replace(lab, source="the manifest's app_io.labels")
    return AppIO(image=parse_image(d["image"]) if d.get("image") else None,
                 audio=parse_audio(d["audio"]) if d.get("audio") else None, text=txt, labels=lab,
                 info=parse_info(d.get("metadata") or {}))
