"""The parity judge is right both ways: matching outputs pass whatever their scale,
mismatched ones fail, a near-tied top-1 flip is reported and a clear one fails, and the
verdict says which criterion decided. No conversion here: plain arrays."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tpu_pipeline.convert import compare, judge, load_profiles
from tpu_pipeline.convert.module.kind import ModuleKind
from tpu_pipeline.convert.module.loaders import load_object
from tpu_pipeline.convert.options import ConvertOptions
from tpu_pipeline.convert.verdict.parity import verdict

PROFILES = load_profiles()
DESKTOP, ANDROID, WEB = PROFILES.get("desktop"), PROFILES.get("android"), PROFILES.get("web")


def _outputs(scale: float, rel_noise: float, n: int = 8, shape=(1, 10), seed: int = 0):
    rng = np.random.default_rng(seed)
    ref = [rng.standard_normal(shape) * scale for _ in range(n)]
    got = [r + rel_noise * scale * rng.standard_normal(shape) for r in ref]
    return ref, got


def _judge(ref, got, prof, classifier=False):
    m = compare(ref, got, classifier=classifier, atol=prof.atol, rtol=prof.rtol)
    return m, verdict({"y": m}, prof)


@pytest.mark.parametrize("scale", [1e-12, 1.0, 1e6])
def test_matching_outputs_pass_at_any_scale(scale):
    m, v = _judge(*_outputs(scale, 1e-4), ANDROID)  # float16-sized error
    assert v["passed"], v["reasons"]
    assert m["cosine"] > 0.9999 and m["snr_db"] > 60
    assert m["max_abs"] < 1e-3 * scale and m["scale"] == pytest.approx(scale, rel=0.5)
    m, v = _judge(*_outputs(scale, 1e-7), DESKTOP)  # float32 kernel noise
    assert v["passed"], v["reasons"]


def test_exactly_equal_outputs_give_a_finite_snr_without_a_warning():
    ref = [np.array([[3.0, 0.0, 7.0]]) for _ in range(4)]  # an argmax or a copied integer output
    with np.errstate(all="raise"):
        m = compare(ref, [r.copy() for r in ref])
    assert m["max_abs"] == 0.0 and m["cosine"] == 1.0
    assert np.isfinite(m["snr_db"]) and m["snr_db"] > 1000  # the largest figure float64 can say, not inf


@pytest.mark.parametrize("scale", [1e-12, 1.0, 1e6])
def test_mismatched_outputs_fail_at_any_scale(scale):
    ref, _ = _outputs(scale, 0.0)
    _, other = _outputs(scale, 0.0, seed=1)  # unrelated outputs of the same size
    m, v = _judge(ref, other, ANDROID)
    assert not v["passed"] and m["cosine"] < 0.9
    assert "y: cosine" in v["decided_by"] and "y: elementwise" in v["decided_by"]
    m, v = _judge(ref, [r * 1.05 for r in ref], ANDROID)  # same direction, 5% too large
    assert m["cosine"] == pytest.approx(1.0) and not v["passed"]
    assert v["decided_by"] == ["y: elementwise"]


def test_old_epsilon_bug_near_zero_outputs_keep_their_cosine():
    # max_abs 2.4e-12 on outputs near 1e-11: the old `+ 1e-12` denominator gave cosine 0.0008
    ref, got = _outputs(1e-11, 1e-3)
    m = compare(ref, got, classifier=False)
    assert m["cosine"] > 0.999 and m["max_abs"] < 1e-13


def test_zero_and_constant_outputs():
    zeros = [np.zeros((1, 6)) for _ in range(4)]
    m, v = _judge(zeros, zeros, DESKTOP)
    assert m["cosine"] == 1.0 and m["max_abs"] == 0 and v["passed"]
    m, v = _judge(zeros, [z + 1e-3 for z in zeros], DESKTOP)  # PyTorch says 0; the artifact does not
    assert m["cosine"] == 0.0 and not v["passed"]
    const = [np.full((1, 6), 5.0) for _ in range(4)]
    m, v = _judge(const, [c * (1 + 1e-6) for c in const], DESKTOP)
    assert v["passed"] and m["cosine"] == pytest.approx(1.0)
    m, v = _judge(const, [c + 1.0 for c in const], DESKTOP)  # cosine cannot see it; elementwise does
    assert m["cosine"] == pytest.approx(1.0) and v["decided_by"] == ["y: elementwise"]


def _logits(n=8, c=10, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, c)) * 3 for _ in range(n)]


def test_near_tie_is_within_float32_noise_of_the_reference_never_the_variants_error():
    # issue 19: the old rule forgave a flip whose gap was below 2x the VARIANT's error, so the larger
    # the error, the more flips it forgave (an int8 pitch tracker shipped at top-1 0.11)
    ref = _logits(n=50)
    ref[3][0, :2] = [20.0, 20.0 + 1e-4]  # PyTorch's own top-2 gap within float32 noise (1e-4 x 20)
    ref[7][0, :2] = [20.0, 20.0 + 1e-2]  # a 0.01 gap: decided in float32
    rng = np.random.default_rng(1)
    got = [r + 5e-3 * rng.standard_normal(r.shape) for r in ref]  # float16-sized error everywhere
    got[3][0, :2] = [20.001, 20.0]
    got[7][0, :2] = [20.02, 20.0]  # the variant's error (0.02) is larger than this gap: still a clear flip
    m, v = _judge(ref, got, ANDROID, classifier=True)
    assert m["top1"] == 0.96 and m["top1_near_ties"] == 1 and m["top1_clear_flips"] == 1
    assert m["top1_tie_noise"] == pytest.approx(1e-4 * (20.0 + 1e-2))
    assert not v["passed"] and "y: top1" in v["decided_by"]  # 0.98 < android's min_top1 0.99
    assert any("near-ties, reported, not counted" in n for n in v["notes"])
    assert m["top1_judged_interval"][0] < m["top1_judged"] < m["top1_judged_interval"][1]


def test_many_near_ties_fail_whatever_their_margins():
    ref = _logits(n=100)
    got = [r.copy() for r in ref]
    for i in range(10):  # 10% of the rows tie within float32 noise and flip
        ref[i][0, :2] = [9.0, 9.0 + 1e-5]
        got[i][0, :2] = [9.0 + 1e-5, 9.0]
    m = compare(ref, got, classifier=True, atol=10.0, rtol=10.0)
    assert m["top1_near_ties"] == 10 and m["top1_judged"] == 1.0 and m["flip_rate"] == 0.1
    v = verdict({"y": m}, WEB)
    assert not v["passed"] and v["decided_by"] == ["y: flip_rate"]


def test_clear_margin_flip_fails_and_says_top1_decided():
    ref = _logits()
    ref[3][0, :2] = [4.0, 9.0]
    got = [r + 1e-3 for r in ref]
    got[3] = ref[3].copy()
    got[3][0, :2] = [9.0, 4.0]  # a clear swap (margin 5), error elsewhere 1e-3
    m = compare(ref, got, classifier=True, atol=10.0, rtol=10.0)
    assert m["top1"] == 0.875 and m["top1_clear_flips"] == 1 and m["top1_near_ties"] == 0
    # elementwise and cosine loosened away: top-1 alone must catch it
    v = verdict({"y": m}, DESKTOP, atol=10.0, rtol=10.0, min_cosine=-1.0)
    assert not v["passed"] and v["decided_by"][:2] == ["y: top1", "y: flip_rate"]
    assert "1 clear flips of 8 rows" in v["reasons"][0]
    assert judge({"y": m}, DESKTOP, atol=10.0, rtol=10.0, min_cosine=-1.0) == (False, v["reasons"])


def test_top1_only_on_class_axis():
    seg = [np.random.default_rng(0).standard_normal((1, 21, 4, 4)) for _ in range(2)]
    assert "top1" not in compare(seg, [s[..., ::-1] for s in seg], classifier=False)

    class Seg(torch.nn.Module):
        def forward(self, x):
            return x.repeat(1, 21, 1, 1), x.mean(dim=(2, 3)).repeat(1, 5)

    kind = ModuleKind.from_loaded(load_object(Seg(), (torch.randn(1, 1, 4, 4),)), ConvertOptions(samples=2),
                                  np.random.default_rng(0))
    # neither output's kind is inferred nor given: judged numerically, never top-1 by default
    assert [kind.output_kind(k) for k in range(2)] == ["unknown", "unknown"]
    kind.m.task = "classification"  # a classification manifest: its [N, C] head holds class scores
    kind.kinds = [kind._kind_without_graph(k) for k in range(2)]
    assert [kind.output_kind(k) for k in range(2)] == ["unknown", "logits"]  # N x C x H x W: never


def test_passing_verdict_names_the_criteria():
    ref, got = _outputs(1.0, 1e-8)
    v = verdict({"y": compare(ref, got, classifier=True, atol=1e-4, rtol=1e-3)}, DESKTOP)
    assert v["passed"] and v["decided_by"] == ["all criteria passed: cosine, elementwise, top1, flip_rate, "
                                               "probability_error"]


def test_exit_code_is_the_worst_kind_and_each_target_says_its_own():
    from pathlib import Path

    from tpu_pipeline.cli.convert import _status
    from tpu_pipeline.convert.result import ConvertResult, TargetResult

    ok = TargetResult(target="desktop", quantization="float32", runtime="x", passed=True)
    size = TargetResult(target="iot", quantization="static_int8", runtime="x").fail("compatibility", "too big")
    wrong = TargetResult(target="android", quantization="float16", runtime="x").fail("parity", "cosine")
    res = lambda *ts: ConvertResult(model="m", kind="module", out=Path("d"), targets={t.target: t for t in ts},  # noqa: E731
                                    report={})
    assert res(ok).exit_code == 0 and res(ok).error() is None
    assert res(ok, size).exit_code == 3
    assert res(size, wrong).exit_code == res(wrong, size).exit_code == 4  # a size refusal never hides wrong numbers
    assert [t.exit_code for t in (ok, size, wrong)] == [0, 3, 4]
    assert [_status(t.to_json()) for t in (ok, size, wrong)] == ["ok", "FAIL 3", "FAIL 4"]
    err = res(size, wrong).error()
    assert err.exit_code == 4 and "iot: too big" in str(err) and "android: cosine" in str(err)


def test_precision_envelope_admits_the_precisions_own_error_and_nothing_beyond():
    # float16-sized weights error of 3% of the output's RMS: over android's 1% elementwise bound
    ref, got = _outputs(1.0, 0.03)
    own = [float(np.abs(g - r).max()) for r, g in zip(ref, got)]  # PyTorch with float16 weights erred as much
    m = compare(ref, got, classifier=False, atol=ANDROID.atol, rtol=ANDROID.rtol, precision_error=own)
    v = verdict({"y": m}, ANDROID)
    assert v["passed"], v["reasons"]
    assert m["within_tol_without_envelope"] is False and m["precision_envelope"] == pytest.approx(2 * max(own))
    assert any("precision loss, not a conversion error" in n for n in v["notes"])
    # the same artifact error where the precision alone errs 10x less: beyond its envelope, it fails
    m = compare(ref, got, classifier=False, atol=ANDROID.atol, rtol=ANDROID.rtol,
                precision_error=[e / 10 for e in own])
    v = verdict({"y": m}, ANDROID)
    assert not v["passed"] and v["decided_by"] == ["y: elementwise"]
    assert "x the precision's own error" in v["reasons"][0]


def test_nan_output_fails_naming_it_and_the_report_still_renders():
    from tpu_pipeline.convert.report import render_html

    ref, got = _outputs(1.0, 1e-4)
    got[3] = got[3] * np.nan
    m, v = _judge(ref, got, ANDROID)
    assert not v["passed"] and m["nonfinite_samples"] == 1
    assert v["reasons"][0] == "y: the artifact outputs NaN/inf on 1 of 8 samples (PyTorch's are finite)"
    page = render_html({"model": "m", "targets": {"android": {"passed": False, "parity": {"outputs": {"y": m}}}}})
    assert "<svg" in page and "android/y: nan" in page
