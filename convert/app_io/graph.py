"""The app graph: the PyTorch model as an app feeds it. An image input becomes NHWC
[1, H, W, 3] (the layout camera frames and MediaPipe's ImageClassifier have); a classifier
that ends in logits gets a softmax when labels are given, so its scores are probabilities.
Eval and calibration rows stay in the model's own input space (`to_app` moves them); pixels
map to the model input by MediaPipe's NormalizationOptions: (pixel - mean) / std."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from tpu_pipeline.convert.app_io.spec import AppIO, ImageInput

PROBABILITY_SUM_TOL = 1e-3  # an output whose rows sum to 1 within this (and are >= 0) is already probabilities


class AppGraph(nn.Module):
    """`module` with input `image_index` taken NHWC (permuted to the NCHW the module expects)
    and, with `softmax`, its first output as probabilities."""

    def __init__(self, module: nn.Module, image_index: int | None, softmax: bool):
        super().__init__()
        self.module, self.image_index, self.softmax = module, image_index, softmax

    def forward(self, *args):
        if self.image_index is not None:
            args = list(args)
            args[self.image_index] = args[self.image_index].permute(0, 3, 1, 2)
        out = self.module(*args)
        if not self.softmax:
            return out
        if isinstance(out, torch.Tensor):
            return torch.softmax(out, dim=-1)
        first, *rest = out  # the labelled output is the first (spec.describe checked its shape)
        return (torch.softmax(first, dim=-1), *rest)


def needs_nhwc(app: AppIO) -> bool:
    return app.image is not None and app.image.layout == "NCHW"


def is_probabilities(head: np.ndarray) -> bool:
    """A [N, C] output already holding probabilities (>= 0, rows summing to 1)."""
    h = np.asarray(head, np.float64)
    return bool(h.size and (h >= 0).all() and np.allclose(h.sum(-1), 1.0, atol=PROBABILITY_SUM_TOL))


def app_graph(module: nn.Module, input_names: list[str], app: AppIO, head: np.ndarray) -> tuple[nn.Module, list[str]]:
    """(the module apps feed, notes saying what changed). head: the first output on a sample."""
    idx = input_names.index(app.image.name) if needs_nhwc(app) else None
    softmax = app.labels is not None and not is_probabilities(head)
    notes = []
    if idx is not None:
        notes.append(f"app graph: input {app.image.name} is NHWC [1, H, W, 3] (PyTorch's NCHW permuted inside the "
                     "graph), the layout camera frames and MediaPipe's ImageClassifier have")
    if softmax:
        notes.append(f"app graph: a softmax appended to output 0 ({len(app.labels.names)} labels given): its scores "
                     "are probabilities")
    if idx is None and not softmax:
        return module, notes
    return AppGraph(module, idx, softmax), notes


def to_app(rows: list[list[np.ndarray]], input_names: list[str], app: AppIO) -> list[list[np.ndarray]]:
    """Rows in the PyTorch model's own input space -> the app graph's (the image input NHWC)."""
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
