"""Small models of the kinds users train themselves (issue 30), trained here in seconds on
synthetic data with labels, each with the kind its labels should make convert infer:

- kws: a 2-layer GRU keyword spotter on feature frames [N, T, F]; class index labels -> logits.
- denoiser: a 1-D conv net with skip connections and LeakyReLU (a small U-Net without
  resampling) on noisy tones [N, 1, L]; clean-signal labels -> regression; metric: SNR in dB,
  declaring its unit and its bound (0.5 dB).
- segmenter: a conv net [N, 1, H, W] -> [N, 3, H, W] on shapes; [N, H, W] class labels -> a
  per-pixel class map (dense_map, mean IoU).
- box_sigmoid: a conv net whose [N, 4] box head ends in a sigmoid; box labels -> regression,
  without labels kind unknown (never top-1).

Each builder returns trained_models.Trained (module, example, calibration rows from the training
split, held-out eval rows and labels, task metric).
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn

from tpu_pipeline.testing.trained_models import (BoxNet, SeqNet, Trained, _shapes, accuracy, mean_iou,
                                                  trained_on)

KWS_T, KWS_F, KWS_CLASSES = 16, 10, 4


def _keywords(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Noisy frames where class k lights feature band k (2 features) for 4 frames at a random time."""
    x = 0.5 * rng.standard_normal((n, KWS_T, KWS_F))
    y = rng.integers(0, KWS_CLASSES, n)
    for i in range(n):
        t = rng.integers(0, KWS_T - 4)
        x[i, t:t + 4, 2 * y[i]:2 * y[i] + 2] += 1.5
    return x.astype(np.float32), y


# Frames [N, T, F] -> class scores [N, 4] from the last step of a 2-layer GRU.
KeywordGRU = functools.partial(SeqNet, hidden=24, features=KWS_F, classes=KWS_CLASSES, layers=2)


def kws(steps: int = 200) -> Trained:
    return trained_on("kws", _keywords, KeywordGRU, (1024, 128), nn.functional.cross_entropy, steps, accuracy, lr=1e-2)


DEN_L = 64


def _noisy_tones(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    t = np.arange(DEN_L)
    clean = np.zeros((n, 1, DEN_L))
    for _ in range(2):
        clean[:, 0] += rng.uniform(0.3, 1.0, (n, 1)) * np.sin(2 * np.pi * rng.uniform(0.02, 0.12, (n, 1)) * t
                                                              + rng.uniform(0, 2 * np.pi, (n, 1)))
    noisy = clean + 0.3 * rng.standard_normal(clean.shape)
    return noisy.astype(np.float32), clean.astype(np.float32)


class Denoiser(nn.Module):
    """Noisy signal [N, 1, L] -> clean estimate [N, 1, L]: encoder, decoder with the encoder's skip."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.enc1 = nn.Conv1d(1, width, 5, padding=2)
        self.enc2 = nn.Conv1d(width, 2 * width, 5, padding=2)
        self.dec1 = nn.Conv1d(3 * width, width, 5, padding=2)
        self.out = nn.Conv1d(width, 1, 1)
        self.act = nn.LeakyReLU(0.1)

    def forward(self, x):
        e1 = self.act(self.enc1(x))
        e2 = self.act(self.enc2(e1))
        d1 = self.act(self.dec1(torch.cat([e2, e1], 1)))
        return self.out(d1) + x


def snr_db(outputs: np.ndarray, clean: np.ndarray) -> float:
    """Mean over rows of 10 log10(|clean|^2 / |clean - estimate|^2)."""
    o, c = outputs.reshape(len(outputs), -1), clean.reshape(len(clean), -1)
    return float(np.mean(10 * np.log10((c * c).sum(1) / np.maximum(((c - o) ** 2).sum(1), 1e-12))))


snr_db.unit, snr_db.max_drop = "dB", 0.5


def denoiser(steps: int = 300) -> Trained:
    return trained_on("denoiser", _noisy_tones, Denoiser, (1024, 128), nn.functional.mse_loss, steps, snr_db)


SEG = 12


def _scenes(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A bright square (class 1) and a dim bar (class 2) on noise (class 0)."""
    img = 0.15 * rng.standard_normal((n, 1, SEG, SEG))
    lab = np.zeros((n, SEG, SEG), np.int64)
    for i in range(n):
        r, c = rng.integers(0, SEG - 4, 2)
        lab[i, r:r + 4, c:c + 4] = 1
        row = rng.integers(0, SEG - 2)
        lab[i, row:row + 2, :][lab[i, row:row + 2, :] == 0] = 2
    img[:, 0] += np.where(lab == 1, 1.0, np.where(lab == 2, 0.45, 0.0))
    return img.astype(np.float32), lab


class Segmenter(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(8, 3, 1))

    def forward(self, x):
        return self.net(x)


def segmenter(steps: int = 200) -> Trained:
    from tpu_pipeline.convert.verdict.task_score import miou

    return trained_on("segmenter", _scenes, Segmenter, (512, 64), nn.functional.cross_entropy, steps, miou, lr=1e-2)


class SigmoidBoxNet(BoxNet):
    """Image [N, 1, 16, 16] -> normalized box [N, 4] through a final sigmoid (a detector's box head)."""

    def forward(self, x):
        return torch.sigmoid(self.net(x))


def box_sigmoid(steps: int = 250) -> Trained:
    return trained_on("box_sigmoid", _shapes, SigmoidBoxNet, (1024, 128), nn.functional.smooth_l1_loss, steps,
                      mean_iou)


BUILDERS = {"kws": kws, "denoiser": denoiser, "segmenter": segmenter, "box_sigmoid": box_sigmoid}
# the kind each model's eval labels should make convert infer for its output
EXPECTED_KIND = {"kws": "logits", "denoiser": "regression", "segmenter": "dense_map", "box_sigmoid": "regression"}
