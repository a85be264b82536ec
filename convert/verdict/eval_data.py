"""Rows of model inputs (and, for --eval-data, their labels) from the files users bring.

Two layouts, for --eval-data and --calib alike:

- FILE.npz: one array per input, named like the input (else `arr_0`, `arr_1`, ... or the
  remaining keys in order), each of shape (N, *input_shape[1:]); optionally a `labels` array of
  N rows (class indices for class scores and probabilities, targets shaped like the output for
  regression, or whatever a --metric function takes). `labels` is never read as an input.
- DIR/: one sample per file, `*.npy` (single-input models: the input with or without its batch
  axis of 1) or `*.npz` (one array per input, keyed as above), taken in file-name order; labels
  in DIR/labels.csv, one line per sample file: `file_name,label` (several values after the name
  for a vector label). A first line whose label is not a number is a header.

Every problem is a UserError (exit 2) naming the file, before anything is written.
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import numpy as np

from tpu_pipeline.convert.tool_output import first_line
from tpu_pipeline.errors import UserError

LABELS_KEY = "labels"       # the .npz array holding the labels
LABELS_FILE = "labels.csv"  # a samples folder's labels: file_name,label[,label...]


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """What one model input takes: its name, its shape (batch 1) and its numpy dtype name."""

    name: str
    shape: tuple[int, ...]  # -1: any length along that axis (a samples folder's rows may differ)
    dtype: str


@dataclasses.dataclass
class EvalData:
    rows: list[list[np.ndarray]]  # per row, one array per input (batch 1)
    labels: np.ndarray | None     # (N, ...) aligned with rows, or None
    source: str                   # how the report names where the rows came from
    raw: list | None = None       # per row, what an app hands over (a sentence), when the rows were decoded from it


def read(path: str | Path, inputs: list[InputSpec], flag: str) -> EvalData:
    """The rows (and labels, if the file or folder holds them) at `path`."""
    p = Path(path)
    if p.is_dir():
        return _read_dir(p, inputs, flag)
    data = _open_npz(p, flag)
    keys = [k for k in data.files if k != LABELS_KEY]
    arrays = []
    for i, spec in enumerate(inputs):
        key = spec.name if spec.name in keys else (f"arr_{i}" if f"arr_{i}" in keys else (keys[i] if i < len(keys) else None))
        if key is None:
            raise UserError(f"{flag} {p}: no array for input {spec.name!r} (keys: {', '.join(data.files)})")
        arr = _member(data, key, p, flag)
        if not _fits(arr.shape[1:], spec.shape[1:]):
            raise UserError(f"{flag} {p}: array {key!r} has shape {list(arr.shape)}; expected (N, "
                            f"{', '.join(map(str, spec.shape[1:]))})")
        arrays.append(_numbers(arr, spec, f"{flag} {p}: array {key!r}"))
    labels = _member(data, LABELS_KEY, p, flag) if LABELS_KEY in data.files else None
    n = min(len(a) for a in arrays)
    if labels is not None:
        if labels.dtype.kind not in "biuf" or labels.ndim == 0:
            raise UserError(f"{flag} {p}: {LABELS_KEY!r} holds {labels.dtype} of shape {list(labels.shape)}; "
                            "labels are numbers, one row per sample")
        lengths = sorted({len(a) for a in arrays} | {len(labels)})
        if len(lengths) > 1:
            raise UserError(f"{flag} {p}: {len(labels)} labels for {n} input rows (every array, {LABELS_KEY!r} "
                            "included, must hold the same number of rows)")
    if n == 0:
        raise UserError(f"{flag} {p}: holds no rows")
    rows = [[a[i:i + 1] for a in arrays] for i in range(n)]
    return EvalData(rows, labels, f"{flag} {p.name}")


def _open_npz(p: Path, flag: str):
    try:
        data = np.load(p, allow_pickle=False)
        data.files  # noqa: B018 - a plain .npy loads as an array: it has no members
    except Exception as e:  # noqa: BLE001
        raise UserError(f"{flag} {p}: not a readable .npz file or samples folder ({type(e).__name__})") from None
    return data


def _member(data, key: str, p: Path, flag: str) -> np.ndarray:
    try:
        arr = data[key]  # a damaged member fails only here: its header, size or checksum
    except Exception as e:  # noqa: BLE001 - ValueError, BadZipFile, OSError, tokenize errors from the header
        raise UserError(f"{flag} {p}: array {key!r} cannot be read ({type(e).__name__}: {first_line(e)})") from None
    if not isinstance(arr, np.ndarray):
        raise UserError(f"{flag} {p}: member {key!r} is not a .npy array")
    return arr


def _numbers(arr: np.ndarray, spec: InputSpec, where: str) -> np.ndarray:
    if arr.dtype.kind not in "biuf":  # complex, strings, records: no number to feed
        raise UserError(f"{where} holds {arr.dtype}; the input takes {spec.dtype}")
    return arr.astype(spec.dtype)


def _read_dir(d: Path, inputs: list[InputSpec], flag: str) -> EvalData:
    files = sorted(f for f in d.iterdir() if f.is_file() and f.suffix in (".npy", ".npz"))
    if not files:
        raise UserError(f"{flag} {d}: a samples folder holds one .npy or .npz file per sample; found none")
    rows = []
    for f in files:
        if f.suffix == ".npy":
            if len(inputs) != 1:
                raise UserError(f"{flag} {f}: a .npy sample feeds one input; the model takes {len(inputs)} "
                                "(use one .npz per sample, an array per input)")
            try:
                arr = np.load(f, allow_pickle=False)
            except Exception as e:  # noqa: BLE001
                raise UserError(f"{flag} {f}: not a readable .npy file ({type(e).__name__})") from None
            rows.append([_sample(arr, inputs[0], f"{flag} {f}")])
        else:
            data = _open_npz(f, flag)
            keys = [k for k in data.files if k != LABELS_KEY]
            row = []
            for i, spec in enumerate(inputs):
                key = spec.name if spec.name in keys else (keys[i] if i < len(keys) else None)
                if key is None:
                    raise UserError(f"{flag} {f}: no array for input {spec.name!r} (keys: {', '.join(data.files)})")
                row.append(_sample(_member(data, key, f, flag), spec, f"{flag} {f}: array {key!r}"))
            rows.append(row)
    labels = _read_labels(d / LABELS_FILE, [f.name for f in files], flag) if (d / LABELS_FILE).exists() else None
    return EvalData(rows, labels, f"{flag} {d.name}/ ({len(files)} sample files)")


def _sample(arr: np.ndarray, spec: InputSpec, where: str) -> np.ndarray:
    """One sample file's array for one input, with its batch axis of 1 (added when it is missing)."""
    if not isinstance(arr, np.ndarray):
        raise UserError(f"{where}: not a .npy array")
    if _fits(arr.shape, spec.shape[1:]):
        arr = arr[None]
    if not _fits(arr.shape, spec.shape):
        raise UserError(f"{where}: shape {list(arr.shape)}; expected {list(spec.shape)} or {list(spec.shape[1:])}")
    return _numbers(arr, spec, where)


def _fits(shape, spec_shape) -> bool:
    """A -1 in the spec takes any length (inputs of several shapes: convert/shapes.py)."""
    return len(shape) == len(spec_shape) and all(d == s or s == -1 for d, s in zip(shape, spec_shape))


def _read_labels(path: Path, names: list[str], flag: str) -> np.ndarray:
    try:
        lines = [r for r in csv.reader(path.read_text().splitlines()) if r and any(c.strip() for c in r)]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise UserError(f"{flag} {path}: cannot be read ({type(e).__name__})") from None
    if lines and len(lines[0]) > 1 and not _is_number(lines[0][1]):
        lines = lines[1:]  # a header
    by_name: dict[str, list[float]] = {}
    for i, row in enumerate(lines, 1):
        name, values = row[0].strip(), [c.strip() for c in row[1:]]
        if not values or not all(_is_number(v) for v in values):
            raise UserError(f"{flag} {path}: line {i}: expected file_name,label (a number), got {','.join(row)!r}")
        if name in by_name:
            raise UserError(f"{flag} {path}: {name!r} is labelled twice")
        by_name[name] = [float(v) for v in values]
    missing = [n for n in names if n not in by_name]
    if missing:
        raise UserError(f"{flag} {path}: {len(names)} sample files but {len(missing)} have no label "
                        f"(first: {missing[0]})")
    stray = sorted(set(by_name) - set(names))
    if stray:
        raise UserError(f"{flag} {path}: labels {stray[0]!r} which is no sample file of the folder")
    widths = {len(by_name[n]) for n in names}
    if len(widths) > 1:
        raise UserError(f"{flag} {path}: every line must hold the same number of label values")
    labels = np.array([by_name[n] for n in names], np.float64)
    labels = labels[:, 0] if labels.shape[1] == 1 else labels
    return labels.astype(np.int64) if np.all(labels == np.round(labels)) and labels.ndim == 1 else labels


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True
