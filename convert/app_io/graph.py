"""The app graph: the PyTorch model as an app feeds it. An image input becomes NHWC
[1, H, W, 3] (the layout camera frames and MediaPipe's ImageClassifier have); token inputs
become int32 (what MediaPipe's text preprocessors write), cast inside to the dtype the model
takes (Hugging Face's int64); a classifier that ends in logits gets a softmax when labels are
given, so its scores are probabilities.
Eval and calibration rows stay in the model's own input space (`to_app` moves them); pixels
map to the model input by MediaPipe's NormalizationOptions: (pixel - mean) / std."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from tpu_pipeline.convert.app_io.spec import AppIO, ImageInput

PROBABILITY_SUM_TOL = 1e-3  # an output whose rows sum to 1 within this (and are >= 0) is already probabilities


class AppGraph(nn.Module):
    """`module` with input `image_index` taken NHWC (permuted to the NCHW the module expects),
    inputs `int32_indices` taken int32 (cast to `cast_to`) and, with `softmax`, its first output
    as probabilities."""

    def __init__(self, module: nn.Module, image_index: int | None, softmax: bool,
                 int32_indices: tuple[int, ...] = (), cast_to: str | None = None):
        super().__init__()
        self.module, self.image_index, self.softmax = module, image_index, softmax
        self.int32_indices, self.cast_to = int32_indices, cast_to

    def forward(self, *args):
        if self.image_index is not None or self.int32_indices:
            args = list(args)
        if self.image_index is not None:
            args[self.image_index] = args[self.image_index].permute(0, 3, 1, 2)
        for i in self.int32_indices:
            args[i] = args[i].to(getattr(torch, self.cast_to))
        out = self.module(*args)
        if not self.softmax:
            return out
        if isinstance(out, torch.Tensor):
            return torch.softmax(out, dim=-1)
        first, *rest = out  # the labelled output is the first (spec.describe checked its shape)
        return (torch.softmax(first, dim=-1), *rest)


def needs_nhwc(app: AppIO) -> bool:
    return app.image is not None and app.image.layout == "NCHW"


def int32_inputs(app: AppIO, input_names: list[str]) -> tuple[int, ...]:
    """The token inputs the app graph takes int32 where the model takes another integer type."""
    if app.text is None or app.text.cast_to is None:
        return ()
    return tuple(input_names.index(n) for n in app.text.names)


def is_probabilities(head: np.ndarray) -> bool:
    """A [N, C] output already holding probabilities (>= 0, rows summing to 1)."""
    h = np.asarray(head, np.float64)
    return bool(h.size and (h >= 0).all() and np.allclose(h.sum(-1), 1.0, atol=PROBABILITY_SUM_TOL))


def app_graph(module: nn.Module, input_names: list[str], app: AppIO, head: np.ndarray) -> tuple[nn.Module, list[str]]:
    """(the module apps feed, notes saying what changed). head: the first output on a sample."""
    idx = input_names.index(app.image.name) if needs_nhwc(app) else None
    softmax = app.labels is not None and not is_probabilities(head)
    ints = int32_inputs(app, input_names)
    notes = []
    if idx is not None:
        notes.append(f"app graph: input {app.image.name} is NHWC [1, H, W, 3] (PyTorch's NCHW permuted inside the "
                     "graph), the layout camera frames and MediaPipe's ImageClassifier have")
    if softmax:
        notes.append(f"app graph: a softmax appended to output 0 ({len(app.labels.names)} labels given): its scores "
                     "are probabilities")
    if ints:
        notes.append(f"app graph: inputs {', '.join(app.text.names)} are int32 (what MediaPipe's text preprocessing "
                     f"writes), cast to the model's {app.text.cast_to} inside the graph")
    if idx is None and not softmax and not ints:
        return module, notes
    return AppGraph(module, idx, softmax, ints, app.text.cast_to if ints else None), notes


def to_app(rows: list[list[np.ndarray]], input_names: list[str], app: AppIO) -> list[list[np.ndarray]]:
    """Rows in the PyTorch model's own input space -> the app graph's (the image input NHWC, token
    inputs int32)."""
    ints = int32_inputs(app, input_names)
    if ints:
        return [[x.astype(np.int32) if i in ints else x for i, x in enumerate(r)] for r in rows]
    if not needs_nhwc(app):
        return rows
    k = input_names.index(app.image.name)
    return [[np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if i == k else x for i, x in enumerate(r)] for r in rows]


def _channels(v: tuple[float, ...]) -> np.ndarray:
    return np.asarray(v if len(v) == 3 else v * 3, np.float32)


def to_pixels(x_nhwc: np.ndarray, img: ImageInput) -> tuple[np.ndarray, float]:
    """An app-graph image row [1, H, W, 3] -> (the uint8 pixels [H, W, 3] an app would hand over,
    the share of values outside 0..255 that clipping changed: rows that are not 8-bit pixels by
    this mean and std)."""
    raw = np.rint(x_nhwc[0] * _channels(img.std) + _channels(img.mean))
    pix = np.clip(raw, 0, 255).astype(np.uint8)
    return pix, float(((raw < -0.5) | (raw > 255.5)).mean())


def from_pixels(pix: np.ndarray, img: ImageInput) -> np.ndarray:
    """uint8 [H, W, 3] -> the model input [1, H, W, 3] float32, as MediaPipe normalises it."""
    return ((pix.astype(np.float32) - _channels(img.mean)) / _channels(img.std))[None]
