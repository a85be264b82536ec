"""Raw data as users keep it, for --eval-data and --calib of a Hugging Face task folder; the
folder's processor (families.py) turns each item into the model's inputs.

- images: a folder with a subfolder per label name (`cat/1.png`), or images beside labels.csv
  (`file_name,label`), or images alone (no labels); decoded with Pillow, as RGB.
- image + mask pairs (segmentation): `images/NAME` and `masks/NAME` (PNG, a class index per pixel).
- text: a CSV with a header naming a `text` (or `sentence`) column and a `label` column, or JSONL
  with {"text": ..., "label": ...} per line; token classification: JSONL with {"tokens": [...],
  "tags": [...]} (also `ner_tags`).
- audio: a folder of .wav files (the standard library's `wave`: 8/16/24/32-bit PCM, channels
  averaged to mono) with labels.csv; .flac with the `soundfile` package when it is installed.

Labels are names (looked up in the model's label2id) or class indices. Every problem is one
UserError (exit 2) naming the file, before anything is written.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import wave
from pathlib import Path

import numpy as np

from tpu_pipeline.errors import UserError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
AUDIO_SUFFIXES = (".wav", ".flac")
LABELS_FILE = "labels.csv"
TEXT_COLUMNS = ("text", "sentence")
TAG_KEYS = ("tags", "ner_tags")
IMAGE_DECODER = "Pillow"
AUDIO_DECODER = "the standard library's wave (PCM .wav); soundfile for .flac"


@dataclasses.dataclass(frozen=True)
class Item:
    where: str           # the file, or "FILE line N": what a message names
    value: object        # a Path (image, audio), a str (text) or a list of words (tokens)
    label: object = None  # a name or index, a list of them (token tags), a Path (mask), or None


def is_raw(path: Path) -> bool:
    """True unless `path` holds rows in the model's input space (.npz, or a folder of .npy/.npz)."""
    if path.is_dir():
        return not any(f.suffix in (".npy", ".npz") for f in path.iterdir() if f.is_file())
    return path.suffix.lower() != ".npz"


def _exists(path: Path, flag: str) -> None:
    if not path.exists():
        raise UserError(f"{flag} {path}: not found")


def _labels_csv(path: Path, flag: str) -> dict[str, str]:
    try:
        rows = [r for r in csv.reader(path.read_text(encoding="utf-8").splitlines()) if r and any(c.strip() for c in r)]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise UserError(f"{flag} {path}: cannot be read ({type(e).__name__})") from None
    if rows and [c.strip().lower() for c in rows[0][:2]] == ["file_name", "label"]:
        rows = rows[1:]
    out = {}
    for i, r in enumerate(rows, 1):
        if len(r) != 2 or not r[0].strip():
            raise UserError(f"{flag} {path}: line {i}: expected file_name,label, got {','.join(r)!r}")
        if r[0].strip() in out:
            raise UserError(f"{flag} {path}: {r[0].strip()!r} is labelled twice")
        out[r[0].strip()] = r[1].strip()
    return out


def _files_with_labels(d: Path, suffixes: tuple[str, ...], flag: str, what: str) -> list[Item]:
    files = sorted(f for f in d.iterdir() if f.is_file() and f.suffix.lower() in suffixes)
    labels = _labels_csv(d / LABELS_FILE, flag) if (d / LABELS_FILE).is_file() else None
    if labels is None:
        return [Item(str(f), f) for f in files]
    stray = sorted(set(labels) - {f.name for f in files})
    if stray:
        raise UserError(f"{flag} {d / LABELS_FILE}: labels {stray[0]!r}, which is no {what} file of {d}")
    missing = [f for f in files if f.name not in labels]
    if missing:
        raise UserError(f"{flag} {missing[0]}: has no line in {d / LABELS_FILE}")
    return [Item(str(f), f, labels[f.name]) for f in files]


def images(path: Path, flag: str) -> list[Item]:
    _exists(path, flag)
    if not path.is_dir():
        raise UserError(f"{flag} {path}: an image model takes a folder of images (a subfolder per label, or "
                        f"images with {LABELS_FILE})")
    subdirs = sorted(p for p in path.iterdir() if p.is_dir())
    if subdirs and not (path / LABELS_FILE).is_file():
        items = [Item(str(f), f, d.name) for d in subdirs for f in sorted(d.iterdir())
                 if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES]
    else:
        items = _files_with_labels(path, IMAGE_SUFFIXES, flag, "image")
    if not items:
        raise UserError(f"{flag} {path}: no image files ({', '.join(IMAGE_SUFFIXES)})")
    return items


def image_masks(path: Path, flag: str) -> list[Item]:
    """images/NAME with masks/NAME (the mask: same stem, a PNG of class indices)."""
    _exists(path, flag)
    img_dir, mask_dir = path / "images", path / "masks"
    if not img_dir.is_dir():
        raise UserError(f"{flag} {path}: a segmentation model takes a folder with images/ (and masks/ for labels)")
    items = []
    for f in sorted(p for p in img_dir.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES):
        mask = mask_dir / (f.stem + ".png")
        if mask_dir.is_dir() and not mask.is_file():
            raise UserError(f"{flag} {f}: no mask {mask}")
        items.append(Item(str(f), f, mask if mask_dir.is_dir() else None))
    if not items:
        raise UserError(f"{flag} {img_dir}: no image files ({', '.join(IMAGE_SUFFIXES)})")
    return items


BOXES_FILE = "boxes.csv"  # detection labels: file_name,label,x0,y0,x1,y1 (pixels of the file), a line per object


def image_boxes(path: Path, flag: str) -> list[Item]:
    """Images with boxes.csv; an image without a line has no objects. label: [(name, x0, y0, x1, y1), ...]."""
    _exists(path, flag)
    if not path.is_dir():
        raise UserError(f"{flag} {path}: a detection model takes a folder of images (with {BOXES_FILE} for labels)")
    files = sorted(f for f in path.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise UserError(f"{flag} {path}: no image files ({', '.join(IMAGE_SUFFIXES)})")
    table = path / BOXES_FILE
    if not table.is_file():
        return [Item(str(f), f) for f in files]
    try:
        lines = [r for r in csv.reader(table.read_text(encoding="utf-8").splitlines())
                 if r and any(c.strip() for c in r)]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise UserError(f"{flag} {table}: cannot be read ({type(e).__name__})") from None
    if lines and lines[0][0].strip().lower() == "file_name":
        lines = lines[1:]
    boxes: dict[str, list] = {f.name: [] for f in files}
    for i, r in enumerate(lines, 1):
        where = f"{flag} {table} line {i}"
        if len(r) != 6:
            raise UserError(f"{where}: expected file_name,label,x0,y0,x1,y1, got {','.join(r)!r}")
        name = r[0].strip()
        if name not in boxes:
            raise UserError(f"{where}: {name!r} is no image file of {path}")
        try:
            x0, y0, x1, y1 = (float(v) for v in r[2:])
        except ValueError:
            raise UserError(f"{where}: the box x0,y0,x1,y1 must be numbers") from None
        if x1 <= x0 or y1 <= y0:
            raise UserError(f"{where}: an empty box (x1 <= x0 or y1 <= y0)")
        boxes[name].append((r[1].strip(), x0, y0, x1, y1, where))
    return [Item(str(f), f, boxes[f.name]) for f in files]


def texts(path: Path, flag: str) -> list[Item]:
    _exists(path, flag)
    if path.suffix.lower() == ".csv":
        return _csv_texts(path, flag)
    if path.suffix.lower() in (".jsonl", ".json"):
        return [Item(w, r.get(_text_key(r, w)), r.get("label")) for w, r in _jsonl(path, flag)]
    raise UserError(f"{flag} {path}: a text model takes a .csv (text,label columns) or a .jsonl file")


def token_rows(path: Path, flag: str) -> list[Item]:
    _exists(path, flag)
    if path.suffix.lower() not in (".jsonl", ".json"):
        raise UserError(f"{flag} {path}: a token classifier takes JSONL rows {{\"tokens\": [...], \"tags\": [...]}}")
    out = []
    for where, r in _jsonl(path, flag):
        tokens = r.get("tokens")
        key = next((k for k in TAG_KEYS if k in r), None)
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise UserError(f"{flag} {where}: expected \"tokens\": a list of words")
        tags = r.get(key) if key else None
        if tags is not None and (not isinstance(tags, list) or len(tags) != len(tokens)):
            raise UserError(f"{flag} {where}: \"{key}\" must hold one tag per token ({len(tokens)})")
        out.append(Item(where, tokens, tags))
    return out


def _text_key(row: dict, where: str) -> str:
    key = next((k for k in TEXT_COLUMNS if isinstance(row.get(k), str)), None)
    if key is None:
        raise UserError(f"{where}: no text field ({' or '.join(TEXT_COLUMNS)})")
    return key


def _jsonl(path: Path, flag: str) -> list[tuple[str, dict]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{flag} {path}: cannot be read ({type(e).__name__})") from None
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{flag} {path} line {i}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{where}: not JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise UserError(f"{where}: expected a JSON object per line")
        out.append((where, row))
    if not out:
        raise UserError(f"{flag} {path}: holds no rows")
    return out


def _csv_texts(path: Path, flag: str) -> list[Item]:
    try:
        rows = list(csv.DictReader(path.read_text(encoding="utf-8").splitlines()))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise UserError(f"{flag} {path}: cannot be read ({type(e).__name__})") from None
    if not rows:
        raise UserError(f"{flag} {path}: holds no rows (a header line, then one row per text)")
    key = next((k for k in TEXT_COLUMNS if k in rows[0]), None)
    if key is None:
        raise UserError(f"{flag} {path}: its header names no {' or '.join(TEXT_COLUMNS)} column "
                        f"(columns: {', '.join(str(c) for c in rows[0])})")
    return [Item(f"{flag} {path} line {i}", r[key] or "", r.get("label")) for i, r in enumerate(rows, 2)]


def audio(path: Path, flag: str) -> list[Item]:
    _exists(path, flag)
    if not path.is_dir():
        raise UserError(f"{flag} {path}: an audio model takes a folder of .wav/.flac files with {LABELS_FILE}")
    items = _files_with_labels(path, AUDIO_SUFFIXES, flag, "audio")
    if not items:
        raise UserError(f"{flag} {path}: no .wav or .flac files")
    return items


def decode_image(path: Path, flag: str) -> np.ndarray:
    """RGB uint8 [H, W, 3] with Pillow."""
    from PIL import Image, UnidentifiedImageError  # Pillow comes with transformers' image processors

    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))
    except (OSError, UnidentifiedImageError, ValueError) as e:
        raise UserError(f"{flag} {path}: not a readable image ({type(e).__name__}: {e})") from None


def decode_mask(path: Path, flag: str) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            m = np.asarray(im)
    except (OSError, UnidentifiedImageError, ValueError) as e:
        raise UserError(f"{flag} {path}: not a readable mask image ({type(e).__name__}: {e})") from None
    if m.ndim != 2:
        raise UserError(f"{flag} {path}: a mask holds one class index per pixel (a single-channel PNG), not "
                        f"shape {list(m.shape)}")
    return m.astype(np.int64)


def decode_audio(path: Path, rate: int, flag: str) -> np.ndarray:
    """Mono float32 in -1..1 at `rate` Hz; another recorded rate is refused (no resampling here)."""
    if path.suffix.lower() == ".flac":
        x, got = _flac(path, flag)
    else:
        x, got = _wav(path, flag)
    if got != rate:
        raise UserError(f"{flag} {path}: recorded at {got} Hz; the model's feature extractor takes {rate} Hz "
                        "(resample the file first)")
    return x


def _wav(path: Path, flag: str) -> tuple[np.ndarray, int]:
    try:
        with wave.open(str(path), "rb") as w:
            width, channels, got = w.getsampwidth(), w.getnchannels(), w.getframerate()
            raw = w.readframes(w.getnframes())
    except (OSError, EOFError, wave.Error) as e:
        raise UserError(f"{flag} {path}: not a readable PCM .wav file ({type(e).__name__}: {e})") from None
    if width == 1:
        x = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128) / 128
    elif width == 2:
        x = np.frombuffer(raw, "<i2").astype(np.float32) / 32768
    elif width == 3:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        x = (((b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)) << 8) >> 8).astype(np.float32) / 8388608
    else:
        x = np.frombuffer(raw, "<i4").astype(np.float32) / 2147483648
    if len(x) == 0:
        raise UserError(f"{flag} {path}: holds no samples")
    return x.reshape(-1, channels).mean(1).astype(np.float32), got


def _flac(path: Path, flag: str) -> tuple[np.ndarray, int]:
    try:
        import soundfile  # optional: only .flac needs it
    except ImportError:
        raise UserError(f"{flag} {path}: .flac needs the soundfile package (pip install soundfile), or give .wav "
                        "files") from None
    try:
        x, got = soundfile.read(str(path), dtype="float32", always_2d=True)
    except Exception as e:  # noqa: BLE001 - soundfile raises its own LibsndfileError and RuntimeError
        raise UserError(f"{flag} {path}: not a readable audio file ({type(e).__name__}: {e})") from None
    return x.mean(1).astype(np.float32), int(got)


def label_index(label, label2id: dict[str, int], where: str) -> int:
    """A label name (through label2id) or a class index -> the index; UserError naming `where`."""
    if isinstance(label, str) and label.strip() in label2id:
        return label2id[label.strip()]
    if isinstance(label, int) or (isinstance(label, str) and label.strip().isdigit()):
        k = int(label)
        if 0 <= k < len(label2id):
            return k
    names = ", ".join(list(label2id)[:12]) + (", ..." if len(label2id) > 12 else "")
    raise UserError(f"{where}: label {label!r} is not in the model's label2id ({names})")
