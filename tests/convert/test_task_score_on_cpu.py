"""Task accuracy with labels (issue 19 item 2): --eval-data with `labels` (a .npz or a folder of
samples with labels.csv), --metric module:function, PyTorch's and each artifact's task score over
the whole eval set with an interval, each profile's max_task_drop bounding the drop, the task
deciding the verdict, and parity rows never used for calibration. On the digits CNN trained in
tests/support/trained_models.py; bad input as fast unit and CLI tests."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from tpu_pipeline.cli import cli
from tpu_pipeline.convert import convert
from tpu_pipeline.convert.runtimes.browser import browser_unavailable
from tpu_pipeline.convert.runtimes.litert import LitertRunner, run_micro
from tpu_pipeline.convert.tflite_info import inspect_model
from tpu_pipeline.convert.verdict import eval_data, task_score
from tpu_pipeline.errors import UserError
from tpu_pipeline.testing import trained_models

SHARED = 10  # eval rows also put into the --calib file: they must be left out of calibration

PLANTED = """
import numpy as np

CALLS = []

def accuracy(outputs, labels):
    CALLS.append(len(labels))
    return float((outputs.argmax(-1) == labels).mean())

def error_rate(outputs, labels):
    return float((outputs.argmax(-1) != labels).mean())
error_rate.higher_is_better = False

def broken(outputs, labels):
    raise KeyError("no such column")

def nan(outputs, labels):
    return float("nan")
"""


@pytest.fixture(scope="module")
def digits():
    return trained_models.digits()


@pytest.fixture(scope="module")
def files(digits, tmp_path_factory):
    """model.pt (the manifest `tpu-pipeline train` writes), eval.npz (x + labels), calib.npz (the
    training split's rows plus SHARED eval rows) and the planted metric module."""
    d = tmp_path_factory.mktemp("task")
    m = digits.module
    torch.save({"format": "tpu-pipeline/model@1", "model_class": "tpu_pipeline.train.models.digits_cnn:DigitsCNN",
                "model_kwargs": {"channels": [8, 16], "hidden": 32, "dropout": 0.0}, "state_dict": m.state_dict(),
                "example_inputs": [digits.example], "input_names": ["x"], "output_names": ["logits"],
                "task": "classification", "recipe": "test", "metrics": {}}, d / "model.pt")
    np.savez(d / "eval.npz", x=digits.eval_x, labels=digits.eval_y)
    np.savez(d / "calib.npz", x=np.concatenate([digits.calib[:64], digits.eval_x[:SHARED]]))
    (d / "planted_metric.py").write_text(textwrap.dedent(PLANTED))
    return d


def _cli(*args, cwd=None, monkeypatch=None):
    if cwd is not None:
        monkeypatch.chdir(cwd)  # the metric module is found in the current folder, as `python -m` would
    return CliRunner().invoke(cli, ["convert", *map(str, args)])


@pytest.mark.slow
def test_cli_task_scores_decide_on_each_runtime(digits, files, tmp_path, monkeypatch):
    """desktop (XNNPACK) and iot (static int8 on TFLM) through the real CLI with labels and a
    planted --metric: each artifact's task score is the metric on that runtime's outputs over
    every labelled row; a numeric bound the task disagrees with (--min-cosine 0.99999 on int8)
    does not refuse an artifact within its task bound; shared calib rows are left out."""
    out = tmp_path / "out"
    r = _cli(files / "model.pt", "--targets", "desktop,iot", "--eval-data", files / "eval.npz", "--calib",
             files / "calib.npz", "--metric", "planted_metric:accuracy", "--min-cosine", "0.99999", "--no-latency",
             "--refine-rounds", "0", "--samples", "64", "--out", out, cwd=files, monkeypatch=monkeypatch)
    assert r.exit_code == 0, r.output
    report = json.loads((out / "report.json").read_text())
    n = len(digits.eval_y)
    assert report["task_score"]["metric"] == "planted_metric:accuracy" and report["task_score"]["rows"] == n
    assert report["samples"] == 64  # parity drew 64 rows; the task is scored on all of them
    with torch.no_grad():
        want_torch = trained_models.accuracy(digits.module(torch.from_numpy(digits.eval_x)).numpy(), digits.eval_y)
    assert report["task"] == "classification" and report["task_score"]["torch_score"] == pytest.approx(want_torch, abs=1e-12)
    note = next(x for x in report["notes"] if x.startswith("calibration:"))
    assert f"{SHARED} of {64 + SHARED} rows of --calib" in note
    rows = [[x[None]] for x in digits.eval_x]
    for name, t in report["targets"].items():
        task = t["parity"]["task_score"]
        art = (out / name / "model.tflite").read_bytes()
        info = inspect_model(art)
        if name == "iot":
            got = run_micro(art, info, rows, 256 * 1024)
        else:
            runner = LitertRunner(art, info)
            got = [runner.run(s) for s in rows]
        want = trained_models.accuracy(np.concatenate([g[0].reshape(1, -1) for g in got]), digits.eval_y)
        assert task["score"] == pytest.approx(want, abs=1e-12), name
        assert task["rows"] == n and task["interval"][0] <= task["score"] <= task["interval"][1]
        assert task["drop"] == pytest.approx(task["torch_score"] - task["score"], abs=1e-12)
        assert task["drop_interval"][0] <= task["drop"] <= task["drop_interval"][1]
        assert task["passed"] and t["passed"] and task["drop"] <= task["max_drop"]
        assert task["max_drop"] == {"desktop": 0.005, "iot": 0.01}[name]
    iot = report["targets"]["iot"]
    assert not iot["parity"]["numeric_verdict"]["passed"]  # mean cosine < 0.99999 ...
    assert any("numeric parity alone would refuse" in w for w in iot["warnings"])  # ... reported, not deciding
    assert "task planted_metric:accuracy over" in r.output  # the summary line per target
    html = (out / "report.html").read_text()
    assert "task planted_metric:accuracy</b> over" in html and "95% CI" in html


@pytest.mark.slow
def test_drop_beyond_the_bound_fails_the_target(digits, tmp_path):
    """Static int8 calibrated on blank images (every range clipped): its accuracy falls far below
    PyTorch's, and the task bound fails it with one reason naming the drop and max_task_drop."""
    rows = [(torch.zeros_like(digits.example),) for _ in range(8)]
    np.savez(tmp_path / "eval.npz", x=digits.eval_x[:200], labels=digits.eval_y[:200])
    r = convert(digits.module, (digits.example,), targets="iot", out=tmp_path / "o", calibration=rows,
                eval_data=tmp_path / "eval.npz", latency=False, refine_rounds=0, metric=task_score.accuracy)
    t = r["iot"]
    task = t.parity["task_score"]
    assert task["drop"] > task["max_drop"] == 0.01 and not task["passed"]
    assert not t.passed and t.failure == "parity" and r.exit_code == 4
    assert t.errors[0].startswith("task accuracy") and "max_task_drop 0.01" in t.errors[0]
    assert (tmp_path / "o" / "iot" / "failed" / "model.tflite").exists()


def test_cli_bad_metric_and_labels_are_one_line_exit_2(files, tmp_path, monkeypatch):
    out = tmp_path / "never"
    args = (files / "model.pt", "--targets", "desktop", "--out", out)
    np.savez(tmp_path / "short.npz", x=np.zeros((5, 1, 8, 8), np.float32), labels=np.zeros(4, np.int64))
    cases = [(("--eval-data", files / "eval.npz", "--metric", "no_such_module:f"),
              "--metric 'no_such_module:f': cannot import 'no_such_module'"),
             (("--eval-data", files / "eval.npz", "--metric", "planted_metric:missing"),
              "planted_metric has no function 'missing'"),
             (("--eval-data", files / "calib.npz", "--metric", "planted_metric:accuracy"),
              "--metric scores the model against labels"),
             (("--eval-data", tmp_path / "short.npz"), "4 labels for 5 input rows")]
    monkeypatch.chdir(files)
    for flags, why in cases:
        r = _cli(*args, *flags)
        errors = [line for line in r.output.splitlines() if line.startswith("Error:")]
        assert r.exit_code == 2 and len(errors) == 1 and why in errors[0], (flags, r.output)
        assert "Traceback" not in r.output
    assert not out.exists()


def _specs():
    return [eval_data.InputSpec("x", (1, 1, 8, 8), "float32")]


def test_samples_folder_with_labels_csv(tmp_path):
    for i in range(3):
        np.save(tmp_path / f"s{i}.npy", np.full((1, 8, 8), i, np.float32))  # no batch axis: added
    np.save(tmp_path / "s3.npy", np.full((1, 1, 8, 8), 3, np.float32))
    (tmp_path / "labels.csv").write_text("file,label\ns0.npy,7\ns1.npy,1\ns2.npy,2\ns3.npy,9\n")
    ev = eval_data.read(tmp_path, _specs(), "--eval-data")
    assert [r[0].shape for r in ev.rows] == [(1, 1, 8, 8)] * 4 and [float(r[0].mean()) for r in ev.rows] == [0, 1, 2, 3]
    assert ev.labels.tolist() == [7, 1, 2, 9] and ev.labels.dtype == np.int64
    (tmp_path / "labels.csv").write_text("s0.npy,7\ns1.npy,1\ns2.npy,2\n")
    with pytest.raises(UserError, match="4 sample files but 1 have no label"):
        eval_data.read(tmp_path, _specs(), "--eval-data")
    (tmp_path / "labels.csv").write_text("s0.npy,7\ns1.npy,1\ns2.npy,2\ns3.npy,x\n")
    with pytest.raises(UserError, match="line 4: expected file_name,label"):
        eval_data.read(tmp_path, _specs(), "--eval-data")
    np.save(tmp_path / "s4.npy", np.zeros((2, 8, 8), np.float32))
    with pytest.raises(UserError, match=r"s4.npy: shape \[2, 8, 8\]"):
        eval_data.read(tmp_path, _specs(), "--eval-data")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="found none"):
        eval_data.read(tmp_path / "empty", _specs(), "--eval-data")


def test_labels_key_is_never_an_input(tmp_path):
    """`labels` first in the file: positional keys skip it (x is taken as the input)."""
    np.savez(tmp_path / "e.npz", labels=np.arange(3), data=np.ones((3, 1, 8, 8), np.float32))
    ev = eval_data.read(tmp_path / "e.npz", _specs(), "--eval-data")
    assert len(ev.rows) == 3 and ev.rows[0][0].shape == (1, 1, 8, 8) and ev.labels.tolist() == [0, 1, 2]


def _scores(rng, n=200, c=5, wrong=0):
    labels = rng.integers(0, c, n)
    ref = np.eye(c, dtype=np.float32)[labels] + 0.01 * rng.standard_normal((n, c)).astype(np.float32)
    got = ref.copy()
    got[:wrong] = np.roll(got[:wrong], 1, axis=1)  # the first `wrong` rows answer the next class
    return labels, ref, got


def test_task_score_values_intervals_and_bound():
    rng = np.random.default_rng(0)
    labels, ref, got = _scores(rng, wrong=6)
    m = task_score.choose(None, labels, ref, "logits", "logits", 1)
    assert m.name == "accuracy" and m.wilson
    ts = task_score.TaskScore(m, labels, [ref], seed=3)
    assert ts.torch_score == 1.0 and ts.torch_interval[0] < 1.0 == ts.torch_interval[1]
    t = ts.judge([got], max_drop=0.01, runtime="r")
    assert t["score"] == pytest.approx(194 / 200) and t["drop"] == pytest.approx(0.03) and not t["passed"]
    assert "drop of 0.03" in t["reason"] and "max_task_drop 0.01" in t["reason"]
    assert t["drop_interval"][0] > 0  # every resample of these rows loses some: the paired interval excludes 0
    assert ts.judge([got], max_drop=0.03, runtime="r")["passed"]
    again = task_score.TaskScore(m, labels, [ref], seed=3).judge([got], 0.01, "r")
    assert again["drop_interval"] == t["drop_interval"]  # seeded: the same interval from the same --seed
    # a metric where lower is better: the drop is the rise of the error
    low = task_score.Metric("err", lambda o, y: float((o.argmax(-1) != y).mean()), higher_is_better=False)
    t = task_score.TaskScore(low, labels, [ref], seed=0).judge([got], 0.01, "r")
    assert t["drop"] == pytest.approx(0.03) and not t["passed"]
    # regression: R^2 by the output's kind
    y = rng.standard_normal((100, 4))
    m = task_score.choose(None, y, y.astype(np.float32), "regression", "box", 1)
    assert m.name == "r2" and task_score.r2(y, y) == 1.0 and task_score.r2(np.zeros_like(y) + y.mean(0), y) == pytest.approx(0)


def test_metric_failures():
    rng = np.random.default_rng(1)
    labels, ref, got = _scores(rng)

    def picky(o, y):
        if o.max() > 5:
            raise ValueError("not the reference")
        return 1.0

    ts = task_score.TaskScore(task_score.Metric("picky", picky), labels, [ref], seed=0)
    t = ts.judge([got + 10], 0.01, "r")  # raising on an artifact's outputs: that target's failure
    assert not t["passed"] and "picky on this artifact's outputs raised ValueError: not the reference" in t["reason"]
    with pytest.raises(UserError, match="on PyTorch's outputs: raised KeyError"):
        task_score.TaskScore(task_score.Metric("k", lambda o, y: {}["x"]), labels, [ref], seed=0)
    with pytest.raises(UserError, match="on PyTorch's outputs: returned nan"):
        task_score.TaskScore(task_score.Metric("n", lambda o, y: float("nan")), labels, [ref], seed=0)
    with pytest.raises(UserError, match="returned str, not a number"):
        task_score.TaskScore(task_score.Metric("s", lambda o, y: "high"), labels, [ref], seed=0)
    with pytest.raises(UserError, match="integer class indices"):
        task_score.choose(None, labels + 0.5, ref, "probabilities", "p", 1)
    with pytest.raises(UserError, match="no built-in metric"):
        task_score.choose(None, labels, ref, "embedding", "e", 1)
    with pytest.raises(UserError, match="NaN or inf"):
        task_score.TaskScore(task_score.Metric("a", task_score.accuracy), np.full(len(labels), np.nan), [ref], 0)


def test_calibration_never_holds_an_eval_row(files, tmp_path):
    from tpu_pipeline.convert.module.kind import ModuleKind
    from tpu_pipeline.convert.options import ConvertOptions

    def load(calib):
        o = ConvertOptions(eval_data=files / "eval.npz", calib=calib)
        return ModuleKind.load(files / "model.pt", o, np.random.default_rng(0), lambda _m: None)

    kind = load(files / "calib.npz")
    evals = {r[0].tobytes() for r in kind.eval_set.rows}
    assert len(kind.calib_data) == 64 and not evals & {r[0].tobytes() for r in kind.calib_data}
    assert any(f"{SHARED} of {64 + SHARED} rows" in n for n in kind.notes)
    np.savez(tmp_path / "all_shared.npz", x=np.load(files / "eval.npz")["x"][:5])
    with pytest.raises(UserError, match=r"every row of --calib \(5\) is also an --eval-data row"):
        load(tmp_path / "all_shared.npz")


def _keys(rows):
    return {r[0].tobytes() for r in rows}


def test_parity_rows_are_never_calibration_rows_in_any_branch():
    """Each branch of the split (issue 19 item 2): --eval-data rows drawn, 2n calibration rows
    (n held out), fewer (half held out), rows given twice, a single row (flagged, not silent),
    and no rows (random parity, random calibration)."""
    from types import SimpleNamespace

    from tpu_pipeline.convert.module.kind import _calibration_overlap, _parity_samples

    m = SimpleNamespace(sample_args=[torch.zeros(1, 3)], int_high=[None])

    def rows(n, start=0):
        return [[np.full((1, 3), start + i, np.float32)] for i in range(n)]

    rng = np.random.default_rng
    # --eval-data: parity rows come from it; calibration is what _without_rows left (apart already)
    s, src, c = _parity_samples(m, rows(10, 100), rows(6), "--calib", 4, rng(0))
    assert len(s) == 4 and "4 of 10 rows, drawn" in src and _keys(c) == _keys(rows(6)) and not _keys(s) & _keys(c)
    # 2n calibration rows: n drawn and held out
    s, src, c = _parity_samples(m, None, rows(20), "--calib", 8, rng(0))
    assert (len(s), len(c)) == (8, 12) and "8 rows drawn, held out" in src and not _keys(s) & _keys(c)
    # fewer than 2n: half held out (the old code used all 5 for both)
    s, src, c = _parity_samples(m, None, rows(5), "--calib", 64, rng(0))
    assert (len(s), len(c)) == (2, 3) and "2 of 5 rows drawn and held out" in src and not _keys(s) & _keys(c)
    assert _keys(s) != _keys(_parity_samples(m, None, rows(5), "--calib", 64, rng(1))[0])  # --seed redraws
    assert _calibration_overlap(s, c) is None
    # a row given twice: its copy leaves calibration with the held-out one
    dup = rows(4) + rows(4)
    s, _, c = _parity_samples(m, None, dup, "--calib", 64, rng(0))
    assert len(s) == 4 and not _keys(s) & _keys(c) and len(c) < 4
    # one row cannot be split: both, and flagged
    s, src, c = _parity_samples(m, None, rows(1), "--calib", 64, rng(0))
    assert _keys(s) == _keys(c) == _keys(rows(1)) and "too few rows to hold any out" in src
    ov = _calibration_overlap(s, c)
    assert ov["rows"] == ov["of"] == 1 and "1 of 1 parity rows are also calibration rows" in ov["why"]
    # every row alike: nothing distinct to calibrate on, so both, and flagged
    s, src, c = _parity_samples(m, None, rows(1) * 6, "--calib", 64, rng(0))
    assert "all alike" in src and _calibration_overlap(s, c)["rows"] == 6
    # no rows: the example input + random parity rows; calibration is drawn in prepare (random)
    s, src, c = _parity_samples(m, None, None, None, 5, rng(0))
    assert len(s) == 5 and c is None and "random inputs" in src


def test_one_calibration_row_is_flagged_on_the_int8_parity_record(tmp_path):
    """A single --calib row is both parity and calibration row: the static int8 target's parity
    record and the report's warnings say so; the float target's record does not (not calibrated)."""
    from tpu_pipeline.testing.reference_models import DepthwiseCNN

    torch.manual_seed(0)
    r = convert(DepthwiseCNN().eval(), (torch.randn(1, 1, 8, 8),), targets="desktop,iot", out=tmp_path / "o",
                calibration=[(torch.randn(1, 1, 8, 8),)], latency=False, refine_rounds=0)
    assert r.report["samples"] == 1 and "too few rows to hold any out" in r.report["sample_source"]
    ov = r["iot"].parity["calibration_overlap"]
    assert r["iot"].precision == "static_int8" and ov["rows"] == ov["of"] == 1
    assert "calibration_overlap" not in r["desktop"].parity
    assert any("parity rows are also calibration rows" in w for w in r.report["warnings"])
    assert "parity rows are also calibration rows" in (tmp_path / "o" / "report.html").read_text()


def _no_gpu():
    from tpu_pipeline.convert.runtimes.litert import gpu_environment

    return gpu_environment()[1]


@pytest.mark.slow
@pytest.mark.skipif(_no_gpu() is not None, reason=f"GPU accelerator: {_no_gpu()}")
@pytest.mark.skipif(browser_unavailable() is not None, reason=f"browser runtime: {browser_unavailable()}")
def test_labelled_accelerator_checks_follow_the_task_scored_run(digits, tmp_path):
    """With labels, android's GPU accelerator run (8 rows) and web's WebGPU and wasm runs (on 32
    parity rows of 64 labelled) are judged against the task-scored CPU run, not PyTorch: a numeric
    bound the task overrules (min_cosine 1 - 1e-8, which float16 misses) refuses none; report.json
    and report.html say which check is task-scored and which numeric, with the output's kind, the
    task score's interval and the GPU accelerator's result."""
    np.savez(tmp_path / "eval.npz", x=digits.eval_x[:64], labels=digits.eval_y[:64])
    r = convert(digits.module, (digits.example,), targets="android,web", out=tmp_path / "o", latency=False,
                eval_data=tmp_path / "eval.npz", refine_rounds=0, min_cosine=1 - 1e-8, metric=task_score.accuracy,
                samples=32)
    for name in ("android", "web"):
        p = r[name].parity
        assert not p["numeric_verdict"]["passed"] and p["task_score"]["passed"] and r[name].passed, name
    web = r["web"].parity
    assert not web["browser"]["numeric_verdict"]["passed"] and web["browser"]["passed"]
    assert web["judged"]["browser"].startswith("numeric on 32 rows against this artifact's CPU run")
    assert web["webgpu"]["done"] and web["webgpu"]["passed"] and "CPU run" in web["judged"]["webgpu"]
    p = r["android"].parity
    gpu = p["gpu_accelerator"]
    assert gpu["done"] and gpu["passed"] and gpu["samples"] == 8
    # judged against the CPU run: its figures are the distance to that run (SwiftShader: float32)
    assert gpu["max_abs"] == pytest.approx(gpu["max_abs_vs_cpu"]) and gpu["max_abs"] < 1e-4
    assert p["judged"]["cpu"] == "task accuracy over all 64 labelled rows on ai-edge-litert (XNNPACK)"
    assert gpu["judged"] == p["judged"]["gpu_accelerator"] and "against this artifact's CPU run" in gpu["judged"]
    html = (tmp_path / "o" / "report.html").read_text()
    # the integer labels make the digits' plain logits class scores (issue 30; it was "kind unknown")
    for shown in ("<b>kind: logits</b>", "<b>task accuracy</b> over 64 labelled rows",
                  "(95% CI", "GPU accelerator run (", "fully accelerated", "judged: CPU run: task accuracy",
                  "GPU accelerator: numeric on 8 rows against this artifact&#x27;s CPU run"):
        assert shown in html, shown


def test_checks_judged_says_which_check_is_numeric():
    ts = {"metric": "accuracy", "rows": 50, "runtime": "ai-edge-litert (XNNPACK)"}
    res = {"runtime": "xnnpack", "task_score": ts, "browser": {"outputs": {}},
           "gpu_accelerator": {"done": False, "reason": "no Vulkan", "samples": 8},
           "webgpu": {"done": True, "samples": 8}, "float16_activations": {}}
    j = task_score.checks_judged(res, True, 20)
    assert j["cpu"].startswith("task accuracy over all 50") and j["gpu_accelerator"] == "not done: no Vulkan"
    assert j["browser"].startswith("numeric on 20 rows against this artifact's CPU run")  # --samples < eval rows
    assert j["webgpu"] == res["webgpu"]["judged"] and "not task-scored" in j["webgpu"] and "fails only on inf" in \
        j["float16_activations"]
    res["browser"] = {"task_score": ts}
    assert task_score.checks_judged(res, True, 50)["browser"].endswith("labelled rows in the browser (wasm)")
    plain = task_score.checks_judged({"runtime": "tflite-micro", "webgpu": {"done": True, "samples": 8}}, False, 64)
    assert plain == {"cpu": "numeric by output kind on 64 rows against PyTorch on tflite-micro",
                     "webgpu": "numeric by output kind on 8 rows against PyTorch"}


def test_too_few_labelled_rows_for_the_bound_is_said():
    """64 rows and a bound of one point: one row (1.56 points) decides, and the record says so
    (bench/verdicts.py --labels: a planted pitch tracker's repaired int8 artifact refused on one
    redraw of five for a single row, while it beat PyTorch over the whole eval set)."""
    rng = np.random.default_rng(2)
    labels, ref, got = _scores(rng, n=64, wrong=1)
    ts = task_score.TaskScore(task_score.choose(None, labels, ref, "logits", "y", 1), labels, [ref], seed=0)
    t = ts.judge([got], max_drop=0.01, runtime="r")
    assert t["drop"] == pytest.approx(1 / 64) and not t["passed"]  # the verdict stays what was measured
    assert "one row moves accuracy by 0.0156" in t["resolution"] and "at least 101 labelled rows" in t["resolution"]
    assert t["resolution"] in t["reason"]
    assert "resolution" not in ts.judge([got], max_drop=0.02, runtime="r")
    labels, ref, got = _scores(rng, n=200, wrong=1)
    ts = task_score.TaskScore(task_score.choose(None, labels, ref, "logits", "y", 1), labels, [ref], seed=0)
    assert "resolution" not in ts.judge([got], max_drop=0.01, runtime="r")


def test_max_task_drop_in_the_metrics_units_per_target_and_its_source():
    """issue 30: the bound in the task's own units, from --max-task-drop (one number or per
    target), else the user metric's max_drop, else the profile; the report says which."""
    targets = ["android", "iot", "desktop"]
    assert task_score.parse_max_drop(None, targets) == {}
    assert task_score.parse_max_drop("0.5", targets) == {"*": 0.5}
    assert task_score.parse_max_drop(0.5, targets) == {"*": 0.5}
    assert task_score.parse_max_drop("android=0.5,iot=1.0", targets) == {"android": 0.5, "iot": 1.0}
    assert task_score.parse_max_drop("0.2, iot=1", targets) == {"*": 0.2, "iot": 1.0}
    for bad, says in (("web=1", "not a requested target"), ("iot=x", "not a number"), ("-1", ">= 0"),
                      ("iot=1,iot=2", "given twice"), ("=1", "TARGET=NUMBER"), ("inf", ">= 0")):
        with pytest.raises(UserError, match=says):
            task_score.parse_max_drop(bad, targets)

    def snr_db(outputs, labels):
        err = ((outputs - labels) ** 2).mean()
        return float(10 * np.log10((labels ** 2).mean() / err))
    snr_db.unit, snr_db.max_drop = "dB", 0.5
    rng = np.random.default_rng(0)
    y = rng.standard_normal((64, 8))
    ref = y + 0.01 * rng.standard_normal(y.shape)
    m = task_score.choose(snr_db, y, ref, "unknown", "clean", 1)
    assert m.unit == "dB" and m.max_drop == 0.5
    given = task_score.parse_max_drop("iot=1.0", targets)
    assert task_score.max_drop_for("iot", 0.01, given, m) == (1.0, "--max-task-drop iot=1")
    bound, source = task_score.max_drop_for("android", 0.01, given, m)
    assert bound == 0.5 and source.endswith("snr_db's max_drop")
    assert task_score.max_drop_for("android", 0.01, {}, task_score.choose(
        None, y, ref, "regression", "clean", 1)) == (0.01, "the android profile")
    ts = task_score.TaskScore(m, y, [ref], seed=0)
    worse = y + 0.0125 * rng.standard_normal(y.shape)  # ~1.9 dB below PyTorch's 40 dB
    t = ts.judge([worse], 0.5, "r", source)
    assert 1.0 < t["drop"] < 3.0 and not t["passed"] and t["unit"] == "dB"
    assert "dB > max_task_drop 0.5 (from the metric" in t["reason"] and t["max_drop_from"] == source
    assert ts.judge([worse], 3.0, "r", "--max-task-drop 3")["passed"]
    snr_db.max_drop = "half"
    with pytest.raises(UserError, match="max_drop"):
        task_score.choose(snr_db, y, ref, "unknown", "clean", 1)


def test_cli_max_task_drop_recorded_and_bad_values_exit_2(files, tmp_path):
    base = ["convert", str(files / "model.pt"), "--eval-data", str(files / "eval.npz"), "--no-latency",
            "--refine-rounds", "0"]
    r = CliRunner().invoke(cli, base + ["--targets", "desktop", "--max-task-drop", "iot=1", "--out",
                                        str(tmp_path / "bad")])
    assert r.exit_code == 2 and "not a requested target" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "bad").exists()
    r = CliRunner().invoke(cli, base + ["--targets", "desktop", "--max-task-drop", "desktop=0.25", "--out",
                                        str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    t = json.loads((tmp_path / "o" / "report.json").read_text())["targets"]["desktop"]["parity"]["task_score"]
    assert t["max_drop"] == 0.25 and t["max_drop_from"] == "--max-task-drop desktop=0.25"
    assert t["unit"] == "share of rows" and "(--max-task-drop desktop=0.25)" in r.output
    # the kind and what it was inferred from, on the console and in report.html
    assert "logits: kind logits (inferred from the eval labels: integer class indices in [0, 10)" in r.output
    assert "<b>logits</b> (inferred from the eval labels" in (tmp_path / "o" / "report.html").read_text()
