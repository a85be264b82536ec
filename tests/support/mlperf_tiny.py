"""MLPerf Tiny's four reference models (mlcommons/tiny, benchmark/training/*),
rebuilt in PyTorch from their Keras definitions, with trained-like statistics
from synthetic data of the real input shapes (see `build`).

- kws:  keyword spotting, DS-CNN (small) on 49 x 10 MFCC frames, 12 classes:
        Conv 64 (10x4, stride 2) + 4 x (depthwise 3x3, pointwise 64), each
        with BatchNorm + ReLU, average pool over the 25 x 5 map, Dense 12, softmax.
- vww:  visual wake words, MobileNetV1 (width 0.25) at 96 x 96 x 3, 2 classes.
- ad:   anomaly detection, dense autoencoder 640 -> 128 x 4 -> 8 -> 128 x 4 -> 640
        (each hidden Dense with BatchNorm + ReLU) on 5 frames x 128 log-mel bins.
- ic:   image classification, ResNet-8 at 32 x 32 x 3 (16/32/64 filters, a 1x1
        convolution on the two strided shortcuts), average pool, Dense 10, softmax.

PyTorch pads 'same' symmetrically where Keras pads strided convolutions
bottom/right: the arithmetic differs at the borders, the parameter counts and
the op graph do not. `param_count` counts what Keras' model.summary() counts
(BatchNorm's moving mean/variance included).

Data: each task is synthetic with the real input statistics' shape (MFCC-like
frames with a decaying per-coefficient spread, smooth [0, 1] images, log-mel-like
frames), and its classes are planted patterns, so a fitted head gives an accuracy to
compare the artifact's with. Used by tests/convert/test_mlperf_tiny_on_cpu.py and
bench/mlperf_tiny.py (`from tpu_pipeline.testing import mlperf_tiny`).
"""

from __future__ import annotations

import dataclasses
import functools
import time

import torch
import torch.nn.functional as F
from torch import nn

NAMES = ("kws", "vww", "ad", "ic")
LOGIT_STD = 3.0   # std of a classifier's logits across classes, as tpu_pipeline.testing.zoo sets it


def _conv_bn(cin, cout, k, stride=1, groups=1, padding=None):
    pad = tuple(x // 2 for x in k) if isinstance(k, tuple) else k // 2
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, pad if padding is None else padding, groups=groups),
                         nn.BatchNorm2d(cout), nn.ReLU())


class DSCNN(nn.Module):
    """benchmark/training/keyword_spotting/keras_model.py, model_name ds_cnn (input N x 1 x 49 x 10)."""

    def __init__(self, classes: int = 12, filters: int = 64):
        super().__init__()
        # Keras 'same' with stride 2: 49 x 10 -> 25 x 5 (padding (4/5, 1/2)); symmetric (5, 2) gives 25 x 5 too
        layers = [_conv_bn(1, filters, (10, 4), 2, padding=(5, 2))]
        for _ in range(4):
            layers += [_conv_bn(filters, filters, 3, groups=filters), _conv_bn(filters, filters, 1)]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(filters, classes)

    def forward(self, x):
        x = self.features(x)
        x = F.avg_pool2d(x, tuple(x.shape[-2:]))  # AveragePooling2D(pool_size=(25, 5))
        return torch.softmax(self.head(torch.flatten(x, 1)), dim=-1)


class MobileNetV1(nn.Module):
    """benchmark/training/visual_wake_words/vww_model.py: MobileNetV1, alpha 0.25, 96 x 96 x 3."""

    PLAN = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 + [(1024, 2), (1024, 1)]

    def __init__(self, classes: int = 2, alpha: float = 0.25):
        super().__init__()
        c = int(32 * alpha)
        layers = [_conv_bn(3, c, 3, 2)]
        for out, stride in self.PLAN:
            out = int(out * alpha)
            layers += [_conv_bn(c, c, 3, stride, groups=c), _conv_bn(c, out, 1)]
            c = out
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        x = self.features(x)
        x = F.avg_pool2d(x, tuple(x.shape[-2:]))
        return torch.softmax(self.head(torch.flatten(x, 1)), dim=-1)


class DenseAutoencoder(nn.Module):
    """benchmark/training/anomaly_detection/keras_model.py: 640 -> 128 x 4 -> 8 -> 128 x 4 -> 640."""

    def __init__(self, dim: int = 640, hidden: int = 128, code: int = 8):
        super().__init__()
        sizes = [dim] + [hidden] * 4 + [code] + [hidden] * 4
        self.body = nn.Sequential(*[nn.Sequential(nn.Linear(a, b), nn.BatchNorm1d(b), nn.ReLU())
                                    for a, b in zip(sizes, sizes[1:])])
        self.out = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.out(self.body(x))


class _ResBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.a = _conv_bn(cin, cout, 3, stride)
        self.b = nn.Sequential(nn.Conv2d(cout, cout, 3, 1, 1), nn.BatchNorm2d(cout))
        self.short = nn.Conv2d(cin, cout, 1, stride) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return torch.relu(self.b(self.a(x)) + self.short(x))


class ResNet8(nn.Module):
    """benchmark/training/image_classification/keras_model.py: resnet_v1_eembc (ResNet-8), 32 x 32 x 3."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = _conv_bn(3, 16, 3)
        self.stacks = nn.Sequential(_ResBlock(16, 16, 1), _ResBlock(16, 32, 2), _ResBlock(32, 64, 2))
        self.head = nn.Linear(64, classes)

    def forward(self, x):
        x = F.avg_pool2d(self.stacks(self.stem(x)), 8)  # AveragePooling2D(pool_size=8)
        return torch.softmax(self.head(torch.flatten(x, 1)), dim=-1)


@dataclasses.dataclass(frozen=True)
class Spec:
    name: str
    build: type
    shape: tuple          # one input, batch 1
    classes: int          # 0: the autoencoder (regression output)
    train_steps: int = 0  # > 0: a short real training instead of the ridge-fitted head (see `build`)


SPECS = {s.name: s for s in [
    Spec("kws", DSCNN, (1, 1, 49, 10), 12),
    Spec("vww", MobileNetV1, (1, 3, 96, 96), 2, train_steps=40),
    Spec("ad", DenseAutoencoder, (1, 640), 0),
    Spec("ic", ResNet8, (1, 3, 32, 32), 10),
]}


def _smooth(g: torch.Generator, n: int, c: int, h: int, w: int, coarse: int = 4) -> torch.Tensor:
    """Low-frequency noise (as natural images and spectrograms are), upsampled from a coarse grid."""
    base = torch.randn(n, c, max(2, h // coarse), max(2, w // coarse), generator=g)
    return F.interpolate(base, size=(h, w), mode="bilinear", align_corners=False)


def data(name: str, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) of the synthetic task: labels are class ids, or the inputs for the autoencoder."""
    s = SPECS[name]
    g = torch.Generator().manual_seed(seed)
    pat = torch.Generator().manual_seed(1234)  # the planted class patterns: the same for every draw
    if s.classes:
        y = torch.randint(0, s.classes, (n,), generator=g)
        _, c, h, w = s.shape
        patterns = _smooth(pat, s.classes, c, h, w, coarse=3)
        x = 1.5 * patterns[y] + _smooth(g, n, c, h, w) + 0.3 * torch.randn(n, c, h, w, generator=g)
        if name == "kws":  # MFCC-like: coefficient k's spread decays with k, c0 carries the energy
            spread = torch.linspace(3.0, 0.5, w)
            x = x * spread - 2.0 * (torch.arange(w) == 0)
        else:  # images in [0, 1], as the references feed them (pixels / 255)
            x = torch.sigmoid(x)
        return x, y
    frames = torch.linspace(0.5, -0.5, 128)  # log-mel-like: louder low bins, 5 frames of 128 bins
    x = (frames + 0.8 * _smooth(g, n, 1, 5, 128, coarse=8)).reshape(n, 640)
    return x, x


@dataclasses.dataclass
class Built:
    spec: Spec
    module: nn.Module
    sample_args: tuple
    fit_s: float         # seconds spent on the statistics and the head
    calib: list          # rows for static int8 calibration (each a 1-tuple of a batch-1 tensor)
    eval_x: torch.Tensor
    eval_y: torch.Tensor


def _features(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The input of the model's last Linear."""
    got = []
    h = (m.head if hasattr(m, "head") else m.out).register_forward_hook(lambda _m, i, _o: got.append(i[0]))
    with torch.no_grad():
        m(x)
    h.remove()
    return got[0]


def _train(m: nn.Module, name: str, steps: int, seed: int) -> None:
    """A short real training (Adam, batch 32, cross-entropy on the planted classes).

    MobileNetV1's 28 layers at 96 x 96 from fan-in initialisation are ill-conditioned: with measured
    BatchNorm and a ridge head its float model flipped 9% of rows under +-2 pixel-levels of noise and
    its int8 artifact failed parity (cosine 0.92). 40 steps (~6 s on one core) give a margin a trained
    model has: measured 0 of 64 rows flip under the same noise, and the int8 artifact passes (TFLM cosine 0.998)."""
    x, y = data(name, 32 * steps, seed=1000 + seed)
    opt = torch.optim.Adam(m.parameters(), 3e-3)
    m.train()
    # one thread: measured 5.8 s for the 40 steps, where two threads on the 2 shared cores under load
    # took 68 s (the second thread waits on the busy core at every op)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for xb, yb in zip(x.split(32), y.split(32)):
            loss = F.nll_loss(torch.log(m(xb) + 1e-9), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)


@functools.lru_cache(maxsize=None)
def build(name: str, *, seed: int = 0, fit_rows: int = 128, calib_rows: int = 160, eval_rows: int = 64) -> Built:
    """The model with trained-like statistics, in eval mode, with calibration and held-out rows
    (cached: tests and bench share one build per argument set; do not mutate the result).

    Backpropagation to convergence took 100+ s per model on the shared 2 cores, so instead: BatchNorm
    statistics measured in train mode on `fit_rows` task inputs (cumulative averages: each BatchNorm sees
    the mean and variance it normalises), then the last Linear fitted by ridge regression on those rows'
    features (one-hot targets scaled to a logit spread of ~3 for the classifiers, the input itself
    for the autoencoder). The rest keeps PyTorch's fan-in initialisation. A spec with `train_steps`
    (vww) is trained for that many steps instead (`_train`), then its BatchNorm statistics are measured
    the same way and its trained head kept."""
    s = SPECS[name]
    torch.manual_seed(seed)
    m = s.build()
    t0 = time.perf_counter()
    if s.train_steps:
        _train(m, name, s.train_steps, seed)
    x, y = data(name, fit_rows, seed=1000 + seed)
    for mod in m.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            mod.reset_running_stats()
            mod.momentum = None  # a cumulative average over the batches below
    m.train()
    with torch.no_grad():
        for chunk in x.split(64):
            m(chunk)
    m.eval()
    if not s.train_steps:
        _fit_head(m, s, x, y)
    fit_s = time.perf_counter() - t0
    cx, _ = data(name, calib_rows, seed=seed + 1)
    ex, ey = data(name, eval_rows, seed=seed + 2)
    return Built(s, m, (ex[:1],), fit_s, [(cx[i:i + 1],) for i in range(calib_rows)], ex, ey)


def _fit_head(m: nn.Module, s: Spec, x: torch.Tensor, y: torch.Tensor) -> None:
    f = _features(m, x)
    target = (F.one_hot(y, s.classes).float() - 1 / s.classes) * 3.0 * s.classes ** 0.5 if s.classes else y
    a = torch.cat([f, torch.ones(len(f), 1)], 1)
    # strong ridge (the mean feature energy): a head that fits noise directions amplifies int8 noise,
    # which a trained head, fitted on far more data than its width, does not
    gram = a.T @ a
    w = torch.linalg.solve(gram + gram.diagonal().mean() * torch.eye(a.shape[1]), a.T @ target)
    head = m.head if s.classes else m.out
    if s.classes:  # logits spread as a trained head's (std ~3 across classes), not the ridge's shrunken ones
        w = w * (LOGIT_STD / float((a @ w).std(-1).mean()))
    with torch.no_grad():
        head.weight.copy_(w[:-1].T)
        head.bias.copy_(w[-1])


def accuracy(name: str, outputs, labels) -> float | None:
    """Top-1 accuracy on the planted classes; None for the autoencoder (its random bottleneck
    reconstructs nothing in particular: judged by cosine against PyTorch only)."""
    if not SPECS[name].classes:
        return None
    out = torch.as_tensor(outputs).reshape(len(labels), -1).float()
    return float((out.argmax(-1) == torch.as_tensor(labels)).float().mean())


def param_count(m: nn.Module) -> int:
    """Parameters as Keras counts them: weights, biases and BatchNorm's gamma, beta, moving mean and variance."""
    return sum(p.numel() for p in m.parameters()) + sum(b.numel() for n, b in m.named_buffers()
                                                         if n.endswith(("running_mean", "running_var")))
