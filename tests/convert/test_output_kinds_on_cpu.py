"""Output kinds (issue 19 item 1): every output is judged by its kind's metric, a kind is
inferred from the graph or given by the user (CLI, manifest, API), an output of unknown kind is
judged numerically and never by top-1, and agreement figures carry their 95% interval."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tpu_pipeline.convert import compare, load_profiles
from tpu_pipeline.convert.lm.quant_recipes import teacher_forced
from tpu_pipeline.convert.report import render_html
from tpu_pipeline.convert.verdict.output_kinds import OUTPUT_KINDS, UNKNOWN, decide, from_labels, mean_iou, parse
from tpu_pipeline.convert.verdict.parity import verdict
from tpu_pipeline.errors import UserError
from tpu_pipeline.stats import wilson

PROFILES = load_profiles()
IOT, WEB = PROFILES.get("iot"), PROFILES.get("web")


def test_every_kind_is_registered_with_a_description():
    assert set(OUTPUT_KINDS.names()) == {"logits", "probabilities", "regression", "embedding", "dense_map",
                                         "token_logits", "multilabel", "unknown"}
    assert all(e.description for e in OUTPUT_KINDS.entries())


def test_wilson_interval_is_honest_at_the_edges():
    lo, hi = wilson(64, 64)
    assert hi == 1.0 and 0.94 < lo < 0.95  # all 64 agree: the agreement may still be 94%
    lo, hi = wilson(0, 10)
    assert lo == 0.0 and 0.27 < hi < 0.29
    assert wilson(50, 100)[0] == pytest.approx(1 - wilson(50, 100)[1])


def test_regression_output_gets_no_top1_and_is_judged_against_the_reference_spread():
    rng = np.random.default_rng(0)
    boxes = [rng.uniform(0, 1, (1, 4)) for _ in range(64)]
    small = [b + 0.01 * rng.standard_normal(b.shape) for b in boxes]   # 1/30 of the spread
    large = [b + 0.3 * rng.standard_normal(b.shape) for b in boxes]    # the spread itself
    m = compare(boxes, small, kind="regression")
    assert "top1" not in m and m["rel_err"] < 0.25
    v = verdict({"boxes": m}, IOT)
    assert v["passed"] and "top1" not in str(v["checks"]) and "cosine" not in str(v["checks"])
    v = verdict({"boxes": compare(boxes, large, kind="regression")}, IOT)
    assert not v["passed"] and v["decided_by"][0] == "boxes: regression_error"


def test_unknown_kind_is_judged_numerically_never_by_top1():
    rng = np.random.default_rng(0)
    ref = [rng.standard_normal((1, 4)) for _ in range(16)]
    m = compare(ref, [r[:, ::-1].copy() for r in ref])  # every argmax may move: no top-1 is asked
    assert m["kind"] == "unknown" and "top1" not in m
    v = verdict({"y": m}, IOT)
    assert [c["criterion"] for c in v["checks"]["y"]] == ["cosine"] and any("kind unknown" in n for n in v["notes"])


def test_clipped_probabilities_fail_though_top1_mostly_holds():
    # the pitch tracker: int8 caps the sigmoid at 0.648 while PyTorch reaches 0.93
    rng = np.random.default_rng(0)
    ref = [np.clip(rng.uniform(0, 0.3, (1, 16)) + np.eye(16)[i % 16] * 0.9, 0, 0.95) for i in range(64)]
    got = [np.minimum(r, 0.648) for r in ref]
    m = compare(ref, got, kind="probabilities")
    assert m["top1"] == 1.0 and m["prob_error"] > 0.2
    v = verdict({"pitch": m}, IOT)
    assert not v["passed"] and v["decided_by"] == ["pitch: probability_error"]


def test_embeddings_judged_by_cosine_and_nearest_neighbours():
    rng = np.random.default_rng(0)
    ref = [rng.standard_normal((1, 32)) for _ in range(64)]
    ok = compare(ref, [r + 0.01 * rng.standard_normal(r.shape) for r in ref], kind="embedding")
    assert ok["nn_agreement"] == 1.0 and verdict({"e": ok}, WEB)["passed"]
    bad = compare(ref, [rng.standard_normal((1, 32)) for _ in ref], kind="embedding")
    assert bad["nn_agreement"] < 0.2 and not verdict({"e": bad}, WEB)["passed"]


def test_dense_map_judged_per_pixel():
    rng = np.random.default_rng(0)
    seg = [rng.standard_normal((1, 5, 8, 8)) for _ in range(4)]
    m = compare(seg, [s + 1e-3 for s in seg], kind="dense_map")
    assert m["pixel_agreement"] == 1.0 and "top1" not in m
    m = compare(seg, [s[:, ::-1].copy() for s in seg], kind="dense_map")
    assert m["pixel_agreement"] < 0.5 and not verdict({"seg": m}, WEB)["passed"]


def test_output_kind_specs_are_checked():
    assert parse(["box=regression", "score=probabilities"]) == {"box": "regression", "score": "probabilities"}
    with pytest.raises(UserError, match="not one of"):
        parse(["box=boxes"])
    with pytest.raises(UserError, match="NAME=KIND"):
        parse(["regression"])


def test_kind_from_the_api_from_the_graph_and_in_the_report(tmp_path):
    from tpu_pipeline.convert import convert

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 6)

        def forward(self, x):
            y = self.fc(x)
            return torch.softmax(y[:, :3], -1), y[:, 3:]

    r = convert(Two().eval(), (torch.randn(1, 8),), targets="desktop", out=tmp_path / "o", latency=False,
                output_kinds={"output_1": "regression"}, samples=16)
    kinds = {n: k["kind"] for n, k in r.report["output_kinds"].items()}
    assert kinds == {"output_0": "probabilities", "output_1": "regression"}
    outs = r.targets["desktop"].parity["outputs"]
    assert "top1_interval" in outs["output_0"] and "top1" not in outs["output_1"]
    html = (tmp_path / "o" / "report.html").read_text()
    assert "kind: probabilities" in html and "kind: regression" in html and "95% CI" in html
    with pytest.raises(UserError, match="no output of that name"):
        convert(Two().eval(), (torch.randn(1, 8),), targets="desktop", out=tmp_path / "p",
                output_kinds={"boxes": "regression"})


def test_manifest_output_kinds_field_round_trips(tmp_path):
    from tpu_pipeline.convert.module.loaders import load_model
    from tpu_pipeline.train.manifest import write_model

    p = tmp_path / "model.pt"
    from tpu_pipeline.train.models.digits_cnn import DigitsCNN

    write_model(p, model_class="tpu_pipeline.train.models.digits_cnn:DigitsCNN", model_kwargs={},
                state_dict=DigitsCNN().state_dict(), example_inputs=[torch.zeros(1, 1, 8, 8)], input_names=["pixels"],
                output_names=["logits"], task="classification", recipe="t", metrics={},
                output_kinds={"logits": "logits"})
    assert torch.load(p, weights_only=True)["output_kinds"] == {"logits": "logits"}
    m = load_model(p)
    assert m.output_kinds == {"logits": "logits"}


def test_teacher_forced_agreement_and_kl_as_llama_cpp_reports_them():
    rng = np.random.default_rng(0)
    seqs = [list(rng.integers(0, 20, 12)) for _ in range(4)]
    ref = [rng.standard_normal((12, 20)) * 3 for _ in seqs]
    same = teacher_forced(ref, ref, seqs)
    assert same["top1_agreement"] == 1.0 and same["mean_kl"] == pytest.approx(0.0, abs=1e-12)
    assert same["tokens"] == 44
    noisy = teacher_forced(ref, [r + 2.0 * rng.standard_normal(r.shape) for r in ref], seqs)
    assert noisy["top1_agreement"] < 0.9 and noisy["mean_kl"] > 0.1


def test_rendered_report_says_kind_unknown():
    rng = np.random.default_rng(0)
    ref = [rng.standard_normal((1, 4)) for _ in range(4)]
    m = compare(ref, ref)
    report = {"model": "m", "targets": {"desktop": {"passed": True, "parity": {"outputs": {"y": m}}}}}
    assert "kind unknown" in render_html(report)


def test_quantized_lm_bundle_is_judged_teacher_forced_never_by_greedy_near_ties(tmp_path):
    """issue 19: a weight-only int8 Phi-3 bundle shipped at greedy agreement 0.375 with "5 near
    ties" judged against its own logit error. A quantized bundle is judged by teacher-forced
    top-1 agreement and mean KL on held-out text; a float bundle still by greedy tokens."""
    import dataclasses
    import hashlib

    from tpu_pipeline.convert.lm import litertlm
    from tpu_pipeline.convert.lm.kind import CausalLMKind
    from tpu_pipeline.convert.result import Artifact

    bundle = b"LITERTLM bundle bytes"
    prof = PROFILES.get("android")
    kind = object.__new__(CausalLMKind)  # no model: the measurements are given
    greedy = {"generation_agreement": 0.375, "near_ties": 5, "agreement_with_near_ties": 1.0,
              "first_generation_divergence": {"prompt": 0}, "logit_max_abs": 0.5, "tokenizer_agreement": 1.0}
    ppl = {"torch": 10.0, "artifact": 10.01, "change": 0.001}
    for top1, kl, passes in ((0.99, 0.001, True), (0.80, 0.001, False), (0.99, 0.5, False)):
        tf = {"tokens": 400, "top1_agreement": top1, "mean_kl": kl, "top1_interval": wilson(int(400 * top1), 400)}
        kind.measured = {hashlib.sha256(bundle).hexdigest(): {**greedy, "perplexity": {**ppl, "teacher_forced": tf}}}
        art = Artifact(model=b"", extra_files={litertlm.BUNDLE_FILE: bundle}, precision="weight_only_int8")
        fig, reasons = kind._bundle_parity(prof, art, tmp_path, lambda _msg: None)
        assert (reasons == []) == passes, (top1, kl, reasons)
        assert fig["judged_by"].startswith("teacher-forced")
    # a float bundle: greedy tokens decide (the near-ties counted by litertlm.verdict)
    art = Artifact(model=b"", extra_files={litertlm.BUNDLE_FILE: bundle}, precision="float16")
    fig, reasons = kind._bundle_parity(dataclasses.replace(prof), art, tmp_path, lambda _msg: None)
    assert fig["judged_by"] == "greedy generations" and reasons == []


def test_cli_output_kind_bad_value_is_one_line_exit_2(tmp_path):
    from click.testing import CliRunner

    from tpu_pipeline.cli import cli
    from tpu_pipeline.testing.model_files import manifest

    p = manifest("DepthwiseCNN", tmp_path / "model.pt")
    r = CliRunner().invoke(cli, ["convert", str(p), "--targets", "desktop", "--output-kind", "logits=box",
                                 "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "not one of" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o").exists()


def test_kinds_from_what_the_labels_say():
    """issue 30: integer labels make class scores, [N, H, W] classes a per-pixel map, 0/1 per column
    multi-label, real values of the output's size regression; labels for something else say nothing."""
    rng = np.random.default_rng(0)
    logits, seg, box = rng.standard_normal((32, 5)), rng.standard_normal((32, 3, 6, 6)), rng.uniform(0, 1, (32, 4))
    assert from_labels(logits, rng.integers(0, 5, 32))[0] == "logits"
    assert from_labels(logits, rng.integers(0, 5, 32).astype(np.float32))[0] == "logits"  # labels.csv reads floats
    assert from_labels(logits, rng.integers(5, 9, 32)) is None  # not indices of its 5 columns
    assert from_labels(seg, rng.integers(0, 3, (32, 6, 6)))[0] == "dense_map"
    assert from_labels(seg, rng.integers(0, 7, (32, 6, 6))) is None
    assert from_labels(box, rng.integers(0, 2, (32, 4)))[0] == "multilabel"
    assert from_labels(box, rng.uniform(0, 1, (32, 4)))[0] == "regression"
    assert from_labels(rng.standard_normal((32, 1, 64)), rng.standard_normal((32, 1, 64)))[0] == "regression"
    assert from_labels(box, rng.uniform(0, 1, (32, 7))) is None  # a --metric's own labels


def test_a_sigmoid_over_a_few_values_is_no_class_output_without_labels():
    """issue 30: a box head [N, 4] ending in a sigmoid was judged by top-1 on every target."""
    rng = np.random.default_rng(0)
    box = rng.uniform(0, 1, (32, 4))
    kind, why = decide(UNKNOWN, "LOGISTIC", 4)
    assert kind == "unknown" and "sigmoid over 4" in why
    assert decide(UNKNOWN, "LOGISTIC", 16)[0] == "probabilities"  # bins of a pitch tracker
    assert decide(UNKNOWN, "SOFTMAX", 4)[0] == "probabilities"
    assert decide(UNKNOWN, None, 10) == UNKNOWN  # plain logits without labels: nothing tells
    # the labels decide: regression values, multi-label 0/1, class indices (with the graph's softmax)
    assert decide(UNKNOWN, "LOGISTIC", 4, box, rng.uniform(0, 1, (32, 4)))[0] == "regression"
    assert decide(UNKNOWN, "LOGISTIC", 4, box, rng.integers(0, 2, (32, 4)))[0] == "multilabel"
    kind, why = decide(UNKNOWN, "SOFTMAX", 4, box, rng.integers(0, 4, 32))
    assert kind == "probabilities" and "class indices" in why and "softmax" in why
    # the user's word stands whatever the labels and graph say
    assert decide(("regression", "given"), "SOFTMAX", 4, box, rng.integers(0, 4, 32)) == ("regression", "given")


def test_mean_iou_counts_the_classes_present():
    t = np.array([[0, 0, 1, 1]])
    assert mean_iou(t, t, 3) == 1.0
    assert mean_iou(np.array([[0, 0, 0, 1]]), t, 3) == pytest.approx((2 / 3 + 1 / 2) / 2)
    m = compare([np.eye(3)[None, :, :, None].repeat(2, -1)], [np.eye(3)[None, :, :, None].repeat(2, -1)],
                kind="dense_map")
    assert m["miou_vs_torch"] == 1.0


def test_multilabel_judged_by_decisions_not_top1():
    rng = np.random.default_rng(0)
    ref = [rng.uniform(0, 1, (1, 6)) for _ in range(64)]
    ok = compare(ref, [np.clip(r + 0.01 * rng.standard_normal(r.shape), 0, 1) for r in ref], kind="multilabel")
    assert "top1" not in ok and ok["label_agreement"] > 0.95
    bad = compare(ref, [1 - r for r in ref], kind="multilabel")
    assert bad["label_agreement"] < 0.05 and not verdict({"tags": bad}, IOT)["passed"]


def test_class_head_and_sigmoid_box_head_kinds_in_one_model(tmp_path):
    """issue 30: the labels (class indices) name the first output's kind; the second, a box head
    ending in a sigmoid, has no labels: kind unknown, judged numerically, never by top-1."""
    from tpu_pipeline.convert import convert

    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
            self.cls, self.box = torch.nn.Linear(16, 5), torch.nn.Linear(16, 4)

        def forward(self, x):
            h = self.body(x)
            return self.cls(h), torch.sigmoid(self.box(h))

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "eval.npz", x=rng.standard_normal((40, 8)).astype(np.float32), labels=rng.integers(0, 5, 40))
    r = convert(TwoHeads().eval(), (torch.randn(1, 8),), targets="desktop", out=tmp_path / "o", latency=False,
                eval_data=tmp_path / "eval.npz")
    kinds = r.report["output_kinds"]
    assert kinds["output_0"]["kind"] == "logits" and "class indices in [0, 5)" in kinds["output_0"]["source"]
    assert kinds["output_1"]["kind"] == "unknown" and "sigmoid over 4" in kinds["output_1"]["source"]
    outs = r["desktop"].parity["outputs"]
    assert "top1" in outs["output_0"] and "top1" not in outs["output_1"]
    assert r["desktop"].parity["task_score"]["metric"] == "accuracy"
