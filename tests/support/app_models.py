"""Tiny classifiers TRAINED for seconds on data an app hands over, for the app_io tests and
bench/app_io.py (issue 38): each with its raw rows (uint8 RGB images, waveforms in -1..1,
sentences), the same rows in the PyTorch model's own input space, and labels.

- colours: a CNN telling which colour (red, green, blue, yellow) a blob on a noisy 16 x 16 RGB
  image has; PyTorch takes NCHW float (pixel - 127.5) / 127.5.
- tones: a 1-D conv net telling low, middle and high tones apart in 0.05 s of 16 kHz audio [1, 800].
- sentiment: word embeddings averaged, positive vs negative sentences; token ids [1, 8] from a
  regex-tokenizer vocab (<PAD> 0, <START> 1, <UNKNOWN> 2).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import torch
from torch import nn

COLOURS = ("red", "green", "blue", "yellow")
RGB = np.array([[220, 30, 30], [30, 200, 40], [40, 60, 230], [230, 220, 40]], np.float32)
SIDE, MEAN, STD = 16, 127.5, 127.5
TONES, RATE, SAMPLES = ("low", "middle", "high"), 16000, 800
WORDS_POS = ("good", "great", "love", "fine", "happy", "nice")
WORDS_NEG = ("bad", "awful", "hate", "poor", "sad", "ugly")
FILLER = ("the", "movie", "was", "it", "really", "very")
LENGTH = 8
SENTIMENT = ("negative", "positive")


@dataclasses.dataclass
class AppModel:
    name: str
    module: nn.Module
    raw: list                     # what an app hands over, one per eval row
    eval_x: np.ndarray            # the eval rows in PyTorch's input space (N, *input[1:])
    eval_y: np.ndarray
    calib_x: np.ndarray           # training rows for calibration
    labels: tuple[str, ...]
    flag: str                     # the --image/--audio/--text value (the vocab path filled in by write_vocab)

    def example(self) -> torch.Tensor:
        return torch.from_numpy(self.calib_x[:1])


def _fit(model: nn.Module, x: np.ndarray, y: np.ndarray, steps: int, lr: float = 1e-2) -> nn.Module:
    g = torch.Generator().manual_seed(0)
    torch.set_num_threads(1)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    model.train()
    for _ in range(steps):
        i = torch.randint(0, len(xt), (32,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(xt[i]), yt[i]).backward()
        opt.step()
    return model.eval()


def _blobs(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    y = rng.integers(0, len(COLOURS), n)
    img = rng.normal(110, 40, (n, SIDE, SIDE, 3))
    for k in range(n):
        r, c = rng.integers(2, SIDE - 6, 2)
        h, w = rng.integers(4, 7, 2)
        img[k, r:r + h, c:c + w] = RGB[y[k]] + rng.normal(0, 12, (h, w, 3))
    return np.clip(np.rint(img), 0, 255).astype(np.uint8), y


class ColourNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                 nn.Linear(16, len(COLOURS)))

    def forward(self, x):
        return self.net(x)


def to_model(pix: np.ndarray) -> np.ndarray:
    """uint8 NHWC -> the CNN's NCHW float input."""
    return ((pix.astype(np.float32) - MEAN) / STD).transpose(0, 3, 1, 2).copy()


def colours(steps: int = 150, n_eval: int = 64) -> AppModel:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    xtr, ytr = _blobs(512, rng)
    xte, yte = _blobs(n_eval, rng)
    m = _fit(ColourNet(), to_model(xtr), ytr, steps)
    return AppModel("colours", m, list(xte), to_model(xte), yte, to_model(xtr[:64]), COLOURS,
                    f"x:mean={MEAN}:std={STD}")


def _tone_clips(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    y = rng.integers(0, len(TONES), n)
    lo = np.array([200.0, 700.0, 2000.0])[y]
    f = lo * rng.uniform(1.0, 1.6, n)
    t = np.arange(SAMPLES) / RATE
    x = rng.uniform(0.3, 0.8, n)[:, None] * np.sin(2 * np.pi * f[:, None] * t + rng.uniform(0, 6.3, n)[:, None])
    x += 0.03 * rng.standard_normal(x.shape)
    return np.clip(x, -1, 1).astype(np.float32), y


class ToneNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(1, 8, 32, stride=8)
        self.head = nn.Linear(8, len(TONES))

    def forward(self, x):  # x: [N, samples]
        h = torch.relu(self.conv(x.unsqueeze(1)))
        return self.head(h.mean(-1))


def tones(steps: int = 200, n_eval: int = 48) -> AppModel:
    torch.manual_seed(0)
    rng = np.random.default_rng(1)
    xtr, ytr = _tone_clips(512, rng)
    xte, yte = _tone_clips(n_eval, rng)
    m = _fit(ToneNet(), xtr, ytr, steps)
    return AppModel("tones", m, list(xte), xte, yte, xtr[:64], TONES, f"x:rate={RATE}")


def vocab() -> dict[str, int]:
    words = ["<PAD>", "<START>", "<UNKNOWN>", *FILLER, *WORDS_POS, *WORDS_NEG]
    return {w: i for i, w in enumerate(words)}


def write_vocab(path: Path) -> Path:
    path.write_text("".join(f"{w} {i}\n" for w, i in vocab().items()), encoding="utf-8")
    return path


def tokenize(sentence: str) -> np.ndarray:
    """MediaPipe's regex tokenizer as the vocab and delimiter define it: <START>, the words, <PAD>s."""
    v = vocab()
    ids = [v["<START>"]] + [v.get(w, v["<UNKNOWN>"]) for w in re.split(r"[^\w\']+", sentence) if w]
    ids = (ids + [v["<PAD>"]] * LENGTH)[:LENGTH]
    return np.array([ids], np.int32)


def _sentences(n: int, rng: np.random.Generator) -> tuple[list[str], np.ndarray]:
    y = rng.integers(0, 2, n)
    out = []
    for label in y:
        words = list(rng.choice(FILLER, rng.integers(2, 4)))
        words.insert(int(rng.integers(0, len(words) + 1)), str(rng.choice(WORDS_POS if label else WORDS_NEG)))
        out.append(" ".join(words))
    return out, y


class SentimentNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(len(vocab()), 8)
        self.head = nn.Linear(8, 2)

    def forward(self, ids):
        return self.head(self.emb(ids).mean(1))


def sentiment(steps: int = 150, n_eval: int = 48) -> AppModel:
    torch.manual_seed(0)
    rng = np.random.default_rng(2)
    s_tr, ytr = _sentences(512, rng)
    s_te, yte = _sentences(n_eval, rng)
    xtr = np.concatenate([tokenize(s) for s in s_tr])
    xte = np.concatenate([tokenize(s) for s in s_te])
    m = _fit(SentimentNet(), xtr, ytr, steps)
    return AppModel("sentiment", m, s_te, xte, yte, xtr[:64], SENTIMENT, "ids:vocab=VOCAB")


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(-1).numpy() == y).mean())
