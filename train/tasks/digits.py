"""digits_cnn: scikit-learn's handwritten digits (shipped with the package).

A fixed stratified train/test split; normalization statistics of the
training split are stored inside the model so it takes raw 0..16 pixels.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from tpu_pipeline.errors import UserError
from tpu_pipeline.train.manifest import write_model
from tpu_pipeline.train.models.digits_cnn import DigitsCNN
from tpu_pipeline.train.tasks.base import TASKS, Task

CALIBRATION_ROWS = 64  # training images shipped in model.pt for int8 calibration


def load_split(test_fraction: float, split_seed: int):
    """(x_train, y_train, x_test, y_test): x float32 (N, 1, 8, 8) raw 0..16, y int64."""
    # heavy: scikit-learn takes about a second to import; only digits runs need it
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(d.target, dtype=torch.int64)
    i_tr, i_te = train_test_split(range(len(y)), test_size=test_fraction, random_state=split_seed,
                                  stratify=d.target)
    return x[i_tr], y[i_tr], x[i_te], y[i_te]


@dataclasses.dataclass(kw_only=True)
class DigitsConfig:
    """The `[digits]` table of a digits_cnn recipe."""

    test_fraction: float = 0.2       # held-out share of sklearn's 1,797 digits
    split_seed: int = 0              # fixed train/test split (independent of the run seed)
    channels: list[int] = dataclasses.field(default_factory=lambda: [16, 32])  # conv widths
    hidden: int = 64                 # width of the hidden dense layer
    dropout: float = 0.1             # dropout before the classifier

    def check(self, section: str) -> None:
        if not 0 < self.test_fraction < 1:
            raise UserError(f"{section}.test_fraction must be in (0, 1), got {self.test_fraction}")
        if not self.channels or any(c < 1 for c in self.channels) or len(self.channels) > 3:
            raise UserError(f"{section}.channels must be 1-3 positive widths (8x8 input halves per conv), "
                            f"got {self.channels}")
        if self.hidden < 1:
            raise UserError(f"{section}.hidden must be >= 1, got {self.hidden}")
        if not 0 <= self.dropout < 1:
            raise UserError(f"{section}.dropout must be in [0, 1), got {self.dropout}")


@TASKS.register("digits_cnn")
class DigitsTask(Task):
    """Small CNN on scikit-learn's 8x8 digits; the exported model takes raw 0..16 pixels."""

    section = "digits"
    Config = DigitsConfig

    def __init__(self, config, *, seed: int, recipe_name: str):
        super().__init__(config, seed=seed, recipe_name=recipe_name)
        c = config
        self.x, self.y, self.x_test, self.y_test = load_split(c.test_fraction, c.split_seed)
        self.num_train = len(self.y)

    def model_kwargs(self) -> dict:
        c = self.config
        return {"channels": list(c.channels), "hidden": c.hidden, "dropout": c.dropout}

    def build_model(self):
        m = DigitsCNN(**self.model_kwargs())
        m.pixel_mean.fill_(self.x.mean())
        m.pixel_std.fill_(self.x.std())
        return m

    def make_batch(self, idx):
        return {"pixels": self.x[idx], "labels": self.y[idx]}

    def count(self, batch):
        return len(batch["labels"])

    def loss_sum(self, model, batch):
        return F.cross_entropy(model(batch["pixels"]).float(), batch["labels"], reduction="sum")

    @torch.no_grad()
    def evaluate(self, model, device) -> dict[str, Any]:
        model.eval()
        logits = model(self.x_test.to(device)).float().cpu()
        model.train()
        pred = logits.argmax(-1)
        return {"accuracy": float((pred == self.y_test).float().mean()), "n": len(self.y_test),
                "loss": float(F.cross_entropy(logits, self.y_test))}

    def export(self, model, out: Path, *, optimizer, metrics) -> None:
        write_model(
            out / "model.pt", model_class="tpu_pipeline.train.models.digits_cnn:DigitsCNN",
            model_kwargs=self.model_kwargs(), state_dict=model.state_dict(),
            example_inputs=[self.x_test[:1].clone()], input_names=["pixels"], output_names=["logits"],
            task="classification", recipe=self.recipe_name, metrics=metrics,
            calibration_inputs=[self.x[:CALIBRATION_ROWS].clone()])

    def flops_per_sample(self, model) -> float:
        flops = 0
        side = 8
        for m in model.modules():
            if isinstance(m, torch.nn.Conv2d):
                flops += 2 * m.in_channels * m.out_channels * 9 * side * side
                side //= 2
            elif isinstance(m, torch.nn.Linear):
                flops += 2 * m.in_features * m.out_features
        return 3.0 * flops  # backward ~ 2x forward
