"""digits_cnn end to end (short): artifacts, manifest, raw-pixel input."""

from __future__ import annotations

import json

import pytest
import torch

from tpu_pipeline.train import run
from tpu_pipeline.train.tasks.digits import load_split
from tpu_pipeline.train.manifest import FORMAT, load_model

SHORT = {"loop.steps": 60, "loop.log_every": 10, "loop.checkpoint_every": 30, "loop.eval_every": 0}


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits") / "run"
    torch.set_num_threads(1)
    ev = run("digits_cnn", out, overrides=SHORT, progress=False)
    return out, ev


def test_writes_every_artifact(digits_run):
    out, ev = digits_run
    for name in ("model.pt", "eval.json", "metrics.jsonl", "checkpoints/latest.json"):
        assert (out / name).is_file(), name
    assert list((out / "tb").glob("events.out.tfevents.*"))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(10, 61, 10))
    assert rows[-1]["loss"] < rows[0]["loss"]  # it learns
    assert all(r["samples_per_s"] > 0 and r["gflops_per_s"] > 0 for r in rows)
    assert json.loads((out / "eval.json").read_text())["accuracy"] == ev["accuracy"]
    assert ev["accuracy"] > 0.8 and ev["n"] == 360


def test_model_pt_is_the_convert_manifest_and_takes_raw_pixels(digits_run):
    out, ev = digits_run
    m = torch.load(out / "model.pt", weights_only=True)
    assert m["format"] == FORMAT and m["task"] == "classification" and m["recipe"] == "digits_cnn"
    assert m["model_class"] == "tpu_pipeline.train.models.digits_cnn:DigitsCNN"
    json.dumps(m["model_kwargs"])  # JSON-able
    (x,) = m["example_inputs"]
    assert x.shape == (1, 1, 8, 8) and x.dtype == torch.float32 and x.max() > 1  # raw 0..16
    assert m["input_names"] == ["pixels"] and m["output_names"] == ["logits"]
    (calib,) = m["calibration_inputs"]
    assert calib.shape == (64, 1, 8, 8) and calib.dtype == torch.float32 and calib.max() == 16
    model = load_model(out / "model.pt")
    _, _, x_test, y_test = load_split(0.2, 0)
    assert 0 <= x_test.min() and x_test.max() == 16
    with torch.no_grad():
        acc = float((model(x_test).argmax(-1) == y_test).float().mean())
    assert acc == pytest.approx(ev["accuracy"])


def test_fresh_run_into_a_used_folder_is_refused(digits_run):
    from tpu_pipeline.errors import UserError

    out, _ = digits_run
    before = (out / "model.pt").read_bytes()
    with pytest.raises(UserError, match="already holds a training run; pass --resume"):
        run("digits_cnn", out, overrides=SHORT)
    assert (out / "model.pt").read_bytes() == before
