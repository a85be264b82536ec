"""int8 calibration defects found and repaired (issue 19 items 5 and 8): a static-int8 tensor
whose representable range clips what the float model reaches on the eval rows is named in the
report, and the accuracy-aware rounds try the repairs (other range estimator, more calibration
rows, layers kept in float32 where the target allows float), each with its cost in bytes and
latency. Judged on the task: the planted case (a pitch tracker calibrated on mostly-silent rows,
trained_models.clipped_pitch) and a small recurrent model (a GRU, trained_models.first_pulse)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tpu_pipeline.convert import convert
from tpu_pipeline.convert.precision.quantize import quantize
from tpu_pipeline.convert.runtimes.litert import LitertRunner
from tpu_pipeline.convert.tflite_info import inspect_model
from tpu_pipeline.convert.verdict import int8_ranges
from tpu_pipeline.testing import trained_models

TASK_DROP = 0.02  # accuracy points: the bound test_trained_verdicts_on_cpu.py holds the trained models to


def test_representable_range_follows_scale_zero_point_and_dtype():
    assert int8_ranges.representable({"dtype": "int8", "scale": 0.5, "zero_point": -128}) == (0.0, 127.5)
    assert int8_ranges.representable({"dtype": "int8", "scale": 0.1, "zero_point": 10}) == pytest.approx((-13.8, 11.7))
    assert int8_ranges.representable({"dtype": "int16", "scale": 1.0, "zero_point": 0}) == (-32767.0, 32767.0)
    assert int8_ranges.representable({"dtype": "float32", "scale": 0.0, "zero_point": 0}) is None
    clip = {"clipped": [{"role": "output", "outside_share": 0.3}, {"role": "activation", "outside_share": 0.9}]}
    assert int8_ranges.material(clip) == 0.3  # only outputs count, and only above MATERIAL
    assert int8_ranges.material({"clipped": [{"role": "output", "outside_share": 0.001}]}) == 0.0


def _task(model: bytes, tr) -> float:
    runner = LitertRunner(model, inspect_model(model))
    return tr.metric(np.concatenate([runner.run([x[None]])[0].reshape(1, -1) for x in tr.eval_x]), tr.eval_y)


def _convert(tr, tmp_path, targets, calib=None, name=None):
    eval_npz = tmp_path / f"{tr.name}-eval.npz"
    np.savez(eval_npz, tr.eval_x)  # parity on the held-out eval rows, none of them a calibration row
    kinds = {"output_0": tr.output_kind} if tr.output_kind else {}
    rows = tr.calib if calib is None else calib
    return convert(tr.module, (tr.example,), targets=targets, out=tmp_path / (name or tr.name), eval_data=str(eval_npz),
                   calibration=[(torch.from_numpy(x[None]),) for x in rows], output_kinds=kinds)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    tr = trained_models.clipped_pitch()
    return tr, _convert(tr, tmp_path_factory.mktemp("planted"), "desktop,iot")


@pytest.mark.slow
def test_planted_clipped_output_is_named_and_repaired_on_its_task(planted):
    tr, result = planted
    with torch.no_grad():
        torch_score = tr.metric(tr.module(torch.from_numpy(tr.eval_x)).numpy(), tr.eval_y)
    float_model = result["desktop"].artifact.model  # the float32 export every variant derives from
    rows = [[x[None]] for x in tr.eval_x]
    key = inspect_model(float_model).inputs[0].key
    # before: ai-edge-quantizer's moving-average ranges cap the sigmoid (its logits' int8 range ends
    # at 0) and the pitch reads wrong
    before = quantize(float_model, "static_int8", [{key: x[None]} for x in tr.calib])
    assert _task(before, tr) < torch_score - 0.2
    clip = int8_ranges.clipping(float_model, before, rows)
    logits = next(c for c in clip["clipped"] if c["module"] == "net.5")
    assert logits["representable"][1] < 1.0 < logits["float_range"][1] and logits["outside_share"] > 0.3
    assert [c["tensor"] for c in clip["outputs_capped"]] == [inspect_model(before).outputs[0].name]
    assert clip["outputs_capped"][0]["int8_reached"][1] < 0.6 < clip["outputs_capped"][0]["float_range"][1]

    # after: the iot artifact ships repaired, right on the task, with each repair and its cost on record
    iot = result["iot"]
    assert iot.passed, iot.reasons
    assert _task(iot.artifact.model, tr) >= torch_score - TASK_DROP
    rep = iot.int8_repairs
    assert rep["before"] == "failed" and rep["chosen"] == "min/max ranges" and "net.5" in rep["clipped"]
    by = {x["repair"].split(" (")[0]: x for x in rep["repairs"]}
    assert not by["more calibration rows"]["tried"] and "256 calibration rows" in by["more calibration rows"]["why"]
    assert not by["keep the clipped layers in float32"]["tried"]
    assert "full-integer" in by["keep the clipped layers in float32"]["why"]
    mm = by["min/max ranges"]
    assert mm["passed"] and mm["bytes_added"] == 0 and mm["latency_ms"] > 0 and mm["latency_ms_before"] > 0
    assert iot.parity["int8_ranges"]["outputs_capped"] == []  # the shipped artifact reaches the float range
    report = json.loads((result.out / "report.json").read_text())
    assert report["targets"]["iot"]["int8_repairs"]["chosen"] == "min/max ranges"
    html = (result.out / "report.html").read_text()
    assert "int8 range repairs (chosen: min/max ranges)" in html and "net.5" in html


@pytest.mark.slow
def test_calibration_without_a_tone_is_refused_with_the_clipping_as_reason(planted, tmp_path):
    """Calibrated on silence alone, no range estimator can know how loud a tone is: refused, and
    the reason names the clipped tensors and the repairs that were tried."""
    tr, _ = planted
    silent = tr.calib[np.abs(tr.calib).max(axis=(1, 2)) < 0.25]  # noise peaks near 0.15, tones near 1
    assert 200 < len(silent) < len(tr.calib)
    iot = _convert(tr, tmp_path, "iot", calib=silent, name="silent")["iot"]
    assert not iot.passed and iot.failure == "parity"
    why = next(x for x in iot.reasons if x.startswith("int8 ranges clip the float model"))
    assert "net.5 (activation)" in why and "repairs tried: min/max ranges; none passes" in why
    assert iot.int8_repairs["chosen"] is None and iot.int8_repairs["before"] == "failed"


@pytest.mark.slow
def test_recurrent_model_ships_only_what_meets_its_task(tmp_path):
    tr = trained_models.first_pulse()
    with torch.no_grad():
        torch_score = tr.metric(tr.module(torch.from_numpy(tr.eval_x)).numpy(), tr.eval_y)
    result = _convert(tr, tmp_path, "desktop,iot")
    for name, t in result.targets.items():
        score = _task(t.artifact.model, tr)
        print(name, t.quantization, t.passed, "task", score, "torch", torch_score, t.int8_repairs and
              t.int8_repairs["chosen"], t.errors[:1])
        assert t.passed == (score >= torch_score - TASK_DROP), (name, score, torch_score, t.errors)
    iot = result["iot"]
    # the GRU's logits clip on ~30% of values with the quantizer's moving-average ranges; min/max ranges ship
    assert iot.passed and iot.int8_repairs["chosen"] == "min/max ranges"
    assert int8_ranges.material(iot.parity["int8_ranges"]) == 0.0
