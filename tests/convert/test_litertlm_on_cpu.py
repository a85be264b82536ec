"""LiteRT-LM bundles: litert-torch's export_hf (no TensorFlow) writes a .litertlm that
litert_lm runs with greedy text equal to transformers' token for token; a quantized
variant's divergences are judged by the near-tie rule; unsupported families are
refused in one line. Each export takes ~40-90 s: two families here (grouped-query
Llama, multi-query Gemma), each exported once: the Llama tests share one `convert`
(its desktop bundle is the float32 export); bench/lm_families.py runs every family."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from tpu_pipeline.convert.lm import litertlm
from tpu_pipeline.convert.lm.decode_ready import eos_token_ids, load_hf_causal_lm
from tpu_pipeline.errors import UserError
from tpu_pipeline.testing.lm_zoo import PROMPTS, save_family

CACHE = 64
NEW_TOKENS = 16


def _char_tokenizer() -> Tokenizer:
    from tpu_pipeline.train.tasks.char_lm import build_tokenizer

    return build_tokenizer().backend_tokenizer


def _ref(ids, gaps):
    return litertlm.Reference(prompt_ids=[1], ids=ids, top2_gaps=gaps)


def test_compare_token_for_token():
    tok = _char_tokenizer()
    one, two, plus, eos = (tok.token_to_id(c) for c in ("1", "2", "+", "</s>"))
    # the engine hides the stop token and streams one piece per token
    assert litertlm._compare(tok, _ref([one, plus, two, eos], [5.0] * 4), ["1", "+", "2"], [eos], None) == {
        "match": True}
    v = litertlm._compare(tok, _ref([one, plus, two], [5.0, 5.0, 0.01]), ["1", "+", "1"], [eos], 0.05)
    assert (v["token_index"], v["torch"], v["litert"], v["near_tie"]) == (2, two, one, True)
    # a gap above the measured logit error is a real divergence
    v = litertlm._compare(tok, _ref([one, plus, two], [5.0, 5.0, 0.2]), ["1", "+", "1"], [eos], 0.05)
    assert (v["token_index"], v["near_tie"]) == (2, False)
    # no logit error measured: never a near-tie
    assert litertlm._compare(tok, _ref([one, two], [5.0, 0.0]), ["1", "1"], [eos], None)["near_tie"] is False
    # the engine went on past the reference's stop token
    v = litertlm._compare(tok, _ref([one, eos], [5.0, 3.0]), ["1", "+"], [eos], 0.05)
    assert (v["token_index"], v["torch"], v["litert"]) == (1, eos, plus)


@pytest.mark.parametrize("model_type, words", [
    ("gpt2", "GPT-2"), ("bert", "'bert'"), ("falcon", "'falcon'")])
def test_unsupported_family_is_refused_in_one_line(model_type, words):
    with pytest.raises(UserError) as e:
        litertlm.check_family(types.SimpleNamespace(model_type=model_type))
    assert words in str(e.value) and "\n" not in str(e.value)


def _parity(folder, model, bundle, work):
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    work.mkdir(exist_ok=True)
    return litertlm.bundle_parity(model, tok, bundle, list(PROMPTS), max_new_tokens=NEW_TOKENS, cache_length=CACHE,
                                  eos_ids=eos_token_ids(model), pad_id=0, work=work)


@pytest.fixture(scope="module")
def llama_converted(tmp_path_factory):
    """One `convert` of the grouped-query Llama: android measures two LM recipes (weight-only int4
    against a 0.1% perplexity bound, then float16), ios float16, desktop the float32 bundle."""
    from tpu_pipeline.convert import convert

    tmp = tmp_path_factory.mktemp("llama_convert")
    folder = save_family("llama", tmp / "llama", kv_heads=2)
    (tmp / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    bound = 0.001
    profiles = _profiles_with(tmp, {"android": ["weight_only_int4", "float16"], "ios": ["float16"]}, bound)
    out = tmp / "dist"
    result = convert(folder, targets="android,ios,desktop", out=out, prompts=tmp / "prompts.txt",
                     lm_max_len=CACHE, lm_prefill_len=16, latency=False, profile_dir=profiles)
    return folder, out, result, bound


@pytest.fixture(scope="module")
def llama(llama_converted, tmp_path_factory):
    """The float32 bundle export_hf wrote for the Llama (desktop's: lm_precisions = ["float32"])."""
    folder, out, _, _ = llama_converted
    bundle = (out / "desktop" / litertlm.BUNDLE_FILE).read_bytes()
    return folder, load_hf_causal_lm(folder), bundle, tmp_path_factory.mktemp("llama_work")


@pytest.mark.slow
def test_llama_gqa_bundle_generates_like_transformers(llama):
    folder, model, bundle, work = llama
    assert bundle[:8] == b"LITERTLM"
    got = _parity(folder, model, bundle, work / "float")
    assert got["generation_agreement"] == 1.0, got["first_generation_divergence"]
    assert got["tokenizer_agreement"] == 1.0
    assert got["prompts"] == len(PROMPTS)
    with litertlm.BundleRunner(work / "float" / litertlm.BUNDLE_FILE, max_num_tokens=CACHE) as r:
        # the bundle carries the start and stop tokens of the folder's tokenizer
        assert r.engine.bos_token_id == model.config.bos_token_id
        assert [model.config.eos_token_id] in r.engine.eos_token_ids


@pytest.mark.slow
def test_dynamic_int8_bundle_is_smaller_and_judged_by_near_ties(llama):
    folder, model, bundle, work = llama
    q = litertlm.bundle_variant(bundle, "dynamic_int8")
    assert len(q) < 0.75 * len(bundle)
    got = _parity(folder, model, q, work / "int8")
    fd = got["first_generation_divergence"]
    if fd is None:
        assert got["generation_agreement"] == 1.0
    else:
        # a divergence only counts as a near-tie when the reference's top-2 gap is below
        # the int8 bundle's measured logit error
        assert got["logit_max_abs"] is not None and got["logit_max_abs"] > 0
        assert fd["near_tie"] == (fd["top2_gap"] < got["logit_max_abs"])
    assert got["agreement_with_near_ties"] >= got["generation_agreement"]


@pytest.mark.slow
def test_convert_gemma_multi_query_ships_the_bundle_and_generate_runs_it(tmp_path, monkeypatch):
    """A family beyond the decode-ready export (Gemma, one kv head) through `tpu-pipeline convert`:
    the target folder holds model.litertlm (and its own graph as model.tflite), parity ran on
    litert_lm, and `generate` answers through LiteRT-LM; the reference client says why it cannot. As an
    rl policy (its recipe recorded) each bundle is scored on the task beside PyTorch, and `eval` scores
    the bundle on the same problems (issue 20 item 4)."""
    import json

    from click.testing import CliRunner

    from tpu_pipeline.cli import cli

    from tpu_pipeline.recipes import find_recipe
    from tpu_pipeline.rl.recipe import load_recipe
    from tpu_pipeline.rl.task_eval import write_record

    folder = save_family("gemma", tmp_path / "gemma", kv_heads=1)
    # as rl saves a policy: the folder records its recipe, so convert scores each bundle on that task. A
    # random model earns nothing from grpo_math's strict verifier; the rl tests' odd_char_sum pays about half
    # the answers, so equal accuracies mean something
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "rl"))
    recipe = tmp_path / "grpo_math.toml"
    recipe.write_text(find_recipe("rl", "grpo_math").read_text().replace(
        'reward = "verl_default"', 'reward = "rewards_for_tests:odd_char_sum"'))
    write_record(load_recipe(recipe, {"data.heldout_n": 24}), folder, engine="local")
    (tmp_path / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    out = tmp_path / "dist"
    r = CliRunner().invoke(cli, ["convert", str(folder), "--targets", "desktop", "--out", str(out), "--prompts",
                                 str(tmp_path / "prompts.txt"), "--max-len", str(CACHE), "--prefill-len", "16",
                                 "--max-task-drop", "desktop=0.02"])
    assert r.exit_code == 0, r.output
    report = json.loads((out / "report.json").read_text())
    t = report["targets"]["desktop"]
    # the task: PyTorch once, the float32 bundle through LiteRT-LM, answer for answer the same
    task, lt = report["lm_task"], t["parity"]["lm_task"]
    assert task["recipe"] == "grpo_math" and task["problems"] == lt["n"] == 24
    assert 0 < task["torch"]["correct"] < 24, task  # the verifier tells these answers apart
    assert lt["accuracy"] == lt["torch_accuracy"] == task["torch"]["accuracy"] and lt["answers_differ"] == 0
    assert lt["interval"][0] < lt["accuracy"] < lt["interval"][1] and lt["passed"] and lt["max_task_drop"] == 0.02
    assert "bundle on LiteRT-LM" in r.output
    assert "task grpo_math on LiteRT-LM" in (out / "report.html").read_text()
    # `eval` scores the shipped bundle (the file, or the convert output folder) on the same problems
    for policy in (out / "desktop" / "model.litertlm", folder):
        e = CliRunner().invoke(cli, ["eval", "--recipe", str(recipe), "--policy", str(policy), "--n", "24", "--k", "0",
                                     "--json"])
        assert e.exit_code == 0, e.output
        res = json.loads(e.output)
        assert (res["correct"], res["n"], res["split"]) == (task["torch"]["correct"], 24, "heldout"), res
        assert res["interval"] == lt["interval"] and res.get("targets", "desktop") == "desktop"
    e = CliRunner().invoke(cli, ["eval", "--policy", str(tmp_path / "prompts.txt")])
    assert e.exit_code == 2 and e.output.startswith("Error: policy") and "not a .litertlm" in e.output
    assert t["passed"] and t["runtime"] == litertlm.RUNTIME
    assert t["parity"]["generation_agreement"] == 1.0 and t["parity"]["prompts"] == len(PROMPTS)
    assert t["parity"]["litert_lm"]["tokenizer_agreement"] == 1.0
    assert "not gemma" in report["notes"][0]
    d = out / "desktop"
    assert {"model.litertlm", "model.tflite", "tokenizer.json", "model.json"} <= {p.name for p in d.iterdir()}
    assert not (d / "lm.json").exists()
    meta = json.loads((d / "model.json").read_text())
    assert meta["kind"] == "litert-lm-bundle" and meta["litertlm"]["cache_length"] == CACHE
    assert t["latency_ms"]["litert_lm"]["decode_tokens_per_s"] > 0
    model = load_hf_causal_lm(folder)
    prompt = PROMPTS[0]
    ids = _char_tokenizer().encode(prompt).ids
    ref = litertlm.greedy_reference(model, ids, 8, eos_token_ids(model), 0).ids
    body = ref[:-1] if ref and ref[-1] in eos_token_ids(model) else ref
    g = CliRunner().invoke(cli, ["generate", str(out), "--prompt", prompt, "--max-new-tokens", "8", "--json"])
    assert g.exit_code == 0, g.output
    assert json.loads(g.output) == {"prompt": prompt, "runtime": "litert-lm",
                                    "text": _char_tokenizer().decode(body, skip_special_tokens=False)}
    g = CliRunner().invoke(cli, ["generate", str(out), "--prompt", prompt, "--runtime", "reference"])
    assert g.exit_code == 2 and "use --runtime litert-lm" in g.output


def test_export_failure_is_a_conversion_error_naming_the_cause(tmp_path, monkeypatch):
    from tpu_pipeline.errors import ConversionError

    def failing_worker(cmd, stdout, **kw):  # what a failed export_hf child leaves in its log
        stdout.write("Traceback (most recent call last):\n  File x\nAttributeError: 'LiteRTLMCache' object has "
                     "no attribute 'get_max_length'\n")
        return types.SimpleNamespace(returncode=1)

    monkeypatch.setattr(litertlm.subprocess, "run", failing_worker)
    with pytest.raises(ConversionError) as e:
        litertlm.export_bundle(tmp_path / "hf", tmp_path, cache_length=CACHE, prefill_length=16)
    assert "export_hf could not write a .litertlm: AttributeError: 'LiteRTLMCache'" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("family, args, words", [
    ("gpt2", [], ".litertlm bundles: GPT-2 is not supported"),
    ("llama", ["--max-len", "999"], "--max-len 999 is over the model's 128 positions"),
    # a plain LM (not an rl policy) has no task score to bound
    ("llama", ["--max-task-drop", "0.02"], "--max-task-drop does not apply here: a causal LM has a task score only"),
])
def test_convert_refuses_unsupported_lm_in_one_line_writing_nothing(tmp_path, family, args, words):
    from click.testing import CliRunner

    from tpu_pipeline.cli import cli

    folder = save_family(family, tmp_path / family)
    r = CliRunner().invoke(cli, ["convert", str(folder), "--out", str(tmp_path / "dist"), *args])
    assert r.exit_code == 2, r.output
    errors = [ln for ln in r.output.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and words in errors[0], r.output
    assert r.output.strip().endswith(errors[0])  # the error is the last line, nothing after it
    assert not (tmp_path / "dist").exists()


def _profiles_with(tmp_path, lists: dict[str, list[str]], max_ppl: float):
    """The shipped profiles with these targets' lm_precisions (and perplexity bound) replaced."""
    import re
    import shutil

    from tpu_pipeline.convert.targets import profile_dir

    d = tmp_path / "profiles"
    shutil.copytree(profile_dir(), d)
    for name, precisions in lists.items():
        path = d / f"{name}.toml"
        text = re.sub(r"^(lm_precisions|max_perplexity_change) = .*$", "", path.read_text(), flags=re.M)
        path.write_text(text + f"\nlm_precisions = {precisions!r}\nmax_perplexity_change = {max_ppl}\n".replace(
            "'", '"'))
    return d


@pytest.mark.slow
def test_convert_measures_lm_recipes_and_ships_the_one_the_rule_picks(llama_converted):
    """One conversion, two LM recipes on android: each measured on litert_lm (greedy agreement) and
    on held-out text (perplexity vs PyTorch); weight-only int4 misses a 0.1% perplexity bound, so
    the next in the profile's order ships. The android/ios folders get LiteRT-LM snippets with the
    bundle's name and the sampler written into it."""
    import json

    _, out, result, bound = llama_converted
    # float32: the bundle's own graph reproduces PyTorch's held-out perplexity
    desk = result["desktop"].parity["lm_recipe"]
    assert desk["perplexity_torch"] > 1 and abs(desk["perplexity_change"]) < 1e-4, desk
    android = result["android"]
    cands = {c["precision"]: c for c in android.candidates}
    assert list(cands) == ["weight_only_int4", "float16"]
    int4, fp16 = cands["weight_only_int4"], cands["float16"]
    for lm in (int4, fp16):
        assert lm["perplexity_torch"] == desk["perplexity_torch"] and lm["max_perplexity_change"] == bound
        assert 0 <= lm["generation_agreement"] <= lm["agreement_with_near_ties"] <= 1
    assert int4["bundle_size_bytes"] < fp16["bundle_size_bytes"]
    assert int4["size_bytes"] < fp16["size_bytes"]
    # int4 weights of this random model move perplexity by far more than the bound (lower, here: either way fails)
    assert abs(int4["perplexity_change"]) > 10 * bound and not int4["passed"]
    assert abs(fp16["perplexity_change"]) < bound and fp16["passed"]
    # no latency measured: the first candidate in the profile's order that passes ships
    assert android.passed and android.precision == "float16" and fp16["chosen"]
    assert "weight_only_int4 failed parity" in android.chosen_because
    report = json.loads((out / "report.json").read_text())
    assert report["targets"]["android"]["candidates"][0]["perplexity_change"] == int4["perplexity_change"]
    assert "<th>perplexity_change</th>" in (out / "report.html").read_text()  # the side-by-side table
    # app snippets: the real bundle name, its KV cache, and the sampler in the bundle (greedy: the folder does
    # not sample)
    meta = json.loads((out / "android" / "model.json").read_text())
    assert meta["litertlm"]["sampler"] == {"type": "GREEDY", "top_k": 1, "top_p": 1.0, "temperature": 1.0, "seed": 0}
    kt = (out / "android" / "LlmRunner.kt").read_text()
    assert f'"$modelDir/{litertlm.BUNDLE_FILE}"' in kt and f"maxNumTokens = {CACHE}," in kt
    assert "SamplerConfig(topK = 1, topP = 1.0, temperature = 1.0, seed = 0)" in kt
    assert meta["app_snippet"].endswith("android/LlmRunner.kt")
    swift = (out / "ios" / "LlmRunner.swift").read_text()
    assert 'forResource: "model", ofType: "litertlm"' in swift
    assert "try? SamplerConfig(topK: 1, topP: 1.0, temperature: 1.0, seed: 0)" in swift
    assert not (out / "desktop" / "LlmRunner.kt").exists()  # desktop has no app_snippet


def test_lm_recipe_verdict_bounds_perplexity_either_way(tmp_path):
    """A recipe whose greedy tokens agree still fails when its held-out perplexity moves past the
    profile's bound, up or down (the figures are the kind's per-bundle measurements)."""
    import dataclasses
    import hashlib

    from tpu_pipeline.convert.lm.kind import CausalLMKind
    from tpu_pipeline.convert.result import Artifact
    from tpu_pipeline.convert.targets import load_profiles

    bundle = b"LITERTLM bundle bytes"
    art = Artifact(model=b"", extra_files={litertlm.BUNDLE_FILE: bundle})
    prof = dataclasses.replace(load_profiles().get("android"), max_perplexity_change=0.02)
    kind = object.__new__(CausalLMKind)  # no model: the measurements are given
    agree = {"generation_agreement": 1.0, "near_ties": 0, "agreement_with_near_ties": 1.0,
             "first_generation_divergence": None, "logit_max_abs": None, "tokenizer_agreement": 1.0}
    for change, passes in ((0.019, True), (-0.019, True), (0.021, False), (-0.03, False)):
        ppl = {"torch": 10.0, "artifact": 10.0 * (1 + change), "change": change}
        kind.measured = {hashlib.sha256(bundle).hexdigest(): {**agree, "perplexity": ppl}}
        _, reasons = kind._bundle_parity(prof, art, tmp_path, lambda _msg: None)
        assert (reasons == []) == passes, (change, reasons)
        if not passes:
            assert reasons == [f"held-out perplexity {ppl['artifact']:.4f} vs PyTorch 10.0000 ({change:+.2%}; "
                               "bound +-2.00%)"]


def test_every_lm_recipe_is_one_quantize_lm_can_make():
    # one list (targets.LM_RECIPES), checked when a profile loads without importing ai-edge-quantizer
    from ai_edge_quantizer import recipe

    from tpu_pipeline.convert.precision import quantize
    from tpu_pipeline.convert.targets import LM_RECIPES

    assert [e.name for e in LM_RECIPES.entries()] == ["float32", "float16", "dynamic_int8", "weight_only_int8",
                                                      "weight_only_int4", "dynamic_int4_block32"]
    for e in LM_RECIPES.entries():
        assert e.description and e.defined_in == "tpu_pipeline.convert.targets"
        made_by = e.obj.quantizer_recipe
        assert (e.name in ("float32", "float16", *quantize.RECIPES)) if made_by is None else callable(
            getattr(recipe, made_by)), e


def test_a_profile_naming_an_unknown_lm_recipe_fails_when_it_loads(tmp_path):
    from tpu_pipeline.convert.targets import load_profiles, profile_dir

    text = (profile_dir() / "android.toml").read_text()
    assert 'lm_precisions = ["weight_only_int8", "float16"]' in text
    (tmp_path / "android.toml").write_text(text.replace('lm_precisions = ["weight_only_int8", "float16"]',
                                                        'lm_precisions = ["weight_only_int3", "float16"]'))
    with pytest.raises(UserError) as e:
        load_profiles(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path / "android.toml") in msg and "'weight_only_int3'" in msg
    assert msg.endswith("valid: dynamic_int4_block32, dynamic_int8, float16, float32, weight_only_int4, "
                        "weight_only_int8"), msg


def test_lm_families_are_one_registry_of_supported_and_refused():
    assert litertlm.LM_FAMILIES.get("llama").refused == ""
    assert litertlm.LM_FAMILIES.get("gpt2").refused.startswith("GPT-2 is not supported")
    with pytest.raises(UserError, match=r"built for model types llama, qwen2, qwen3, mistral, gemma, gemma2, "
                                        r"gemma3_text, phi3, not 'bert'"):
        litertlm.check_family(types.SimpleNamespace(model_type="bert"))


def test_task_drop_verdict_bounds_the_bundle_against_pytorch():
    """A bundle may answer at most max_task_drop of the problems worse than PyTorch; better is never a failure."""
    from tpu_pipeline.convert.lm.task_accuracy import verdict

    def fig(torch_correct, correct, n=200):
        return {"accuracy": correct / n, "n": n, "interval": [0.0, 1.0], "torch_accuracy": torch_correct / n,
                "torch_interval": [0.0, 1.0], "drop_points": 100 * (torch_correct - correct) / n}

    assert verdict(fig(150, 148), 0.01, "grpo_math") == []  # exactly one point: at the bound
    (why,) = verdict(fig(150, 147), 0.01, "grpo_math")
    assert "1.5 points lower" in why and "max_task_drop = 1.0 points" in why and "grpo_math" in why
    assert verdict(fig(100, 190), 0.0, "grpo_math") == []
    assert verdict(fig(100, 99), 0.0, "grpo_math") != []


def test_eval_finds_the_bundles_a_path_names(tmp_path):
    """A .litertlm file, a target folder, a convert output folder (identical bundles once, named by all
    their targets) or a Hugging Face folder (None: PyTorch's); anything else is one UserError."""
    from tpu_pipeline.convert.lm.litertlm_runtime import bundles_in

    for target, data in (("android", b"int8"), ("ios", b"int8"), ("desktop", b"float32")):
        (tmp_path / "dist" / target).mkdir(parents=True)
        (tmp_path / "dist" / target / "model.litertlm").write_bytes(data)
    found = bundles_in(tmp_path / "dist")
    assert sorted(label for label, _ in found) == ["android,ios", "desktop"]
    assert bundles_in(tmp_path / "dist" / "ios") == [("ios", tmp_path / "dist" / "ios" / "model.litertlm")]
    assert bundles_in(tmp_path / "dist" / "ios" / "model.litertlm")[0][0] == "ios"
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    assert bundles_in(tmp_path / "hf") is None
    (tmp_path / "notes.txt").write_text("x")
    for bad, words in ((tmp_path / "notes.txt", "not a .litertlm bundle"), (tmp_path / "nope", "no such file"),
                       (tmp_path / "hf" / "..", "neither a Hugging Face policy folder")):
        with pytest.raises(UserError, match=words):
            bundles_in(bad)
