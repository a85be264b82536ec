"""The `causal-lm` model kind: a Hugging Face causal-LM folder (config.json,
*.safetensors, tokenizer.json) becomes, per target, a LiteRT-LM bundle
(model.litertlm: what apps load with LiteRT-LM's Engine; litertlm.py) and,
for the Llama family (Llama, Mistral, Qwen2), also this project's
decode-ready artifact (model.tflite with prefill + decode signatures,
explicit KV cache, lm.json and the tokenizer beside it; the web page and
`generate --runtime reference` drive it). Each is proven by greedy
generations that agree with PyTorch token for token on its own runtime
(litert_lm; ai-edge-litert, plus the usual metrics on each prompt's last
prefill logits). For other families the target's model.tflite is the
bundle's own prefill/decode graph.

Exported once in float32; each target's candidates (its profile's
lm_precisions: LM recipes such as weight-only int8/int4, quant_recipes.py,
preferred first) are derived from that one export with ai-edge-quantizer,
never exported again. Each candidate is judged by greedy agreement on its
runtimes and by its held-out perplexity against PyTorch's (profile
max_perplexity_change); the pipeline ships the first that passes and fits
the target's checks unless a later one is clearly faster (pipeline._choose).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from tpu_pipeline.convert.kinds import ModelKind, Progress, register_kind
from tpu_pipeline.convert.lm import litertlm, task_accuracy
from tpu_pipeline.convert.runtimes.browser import browser_unavailable, generate_litertjs
from tpu_pipeline.convert.verdict import parity, task_score
from tpu_pipeline.convert.lm.decode_ready import (LLAMA_FAMILY, TOKENIZER_FILES, cache_lengths, eos_token_ids,
                                            generation_parity, load_hf_causal_lm, write_decode_ready)
from tpu_pipeline.convert.lm.decode_ready_runtime import META_FILE, LiteRTLanguageModel
from tpu_pipeline.convert.lm.quant_recipes import (heldout_sequences, quantize_lm, teacher_forced,
                                                   perplexity, tflite_perplexity, torch_logits)
from tpu_pipeline.convert.options import PROMPTS_DEFAULT, ConvertOptions
from tpu_pipeline.convert.result import Artifact, Parity, TargetResult
from tpu_pipeline.convert.runtimes.measure import MEASURE_THREADS, median_ms, torch_threads
from tpu_pipeline.convert.targets import LM_RECIPES, TargetProfile
from tpu_pipeline.convert.tflite_info import ModelInfo
from tpu_pipeline.convert.tool_output import quiet_native
from tpu_pipeline.errors import ConversionError, UserError
from tpu_pipeline.stats import wilson

MAX_NEW_TOKENS = 16
RUNTIME = "ai-edge-litert XNNPACK (prefill/decode signatures)"
FLOAT_RECIPES = ("float32", "float16")  # bundles judged by greedy generations; the others teacher-forced
NOT_FOR_HF = "does not apply to a Hugging Face causal-LM folder (its config.json and safetensors define the model)"


CAUSAL_LM_HEADS = ("ForCausalLM", "LMHeadModel")  # Transformers' causal-LM classes (GPT2LMHeadModel, ...)


def names_causal_lm(path: Path) -> bool:
    """config.json's `architectures` name a causal-LM head: never the tokenizer files beside it (a BERT
    sequence classifier has config.json and tokenizer.json too)."""
    try:
        archs = json.loads((path / "config.json").read_text(encoding="utf-8")).get("architectures") or []
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return False
    return isinstance(archs, list) and any(isinstance(a, str) and a.endswith(CAUSAL_LM_HEADS) for a in archs)


def is_causal_lm_folder(path: Path) -> bool:
    return path.is_dir() and names_causal_lm(path) and (path / "tokenizer.json").is_file()


def read_prompts(path: str | Path | None, tokenizer, n: int, vocab: int, max_prompt: int, rng) -> tuple[list[list[int]], str]:
    if path:
        lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
        if not lines:
            raise UserError(f"--prompts {path}: no prompts (one per line)")
        ids = [tokenizer.encode(ln).ids for ln in lines[:n]]
        too_long = [i for i, p in enumerate(ids) if len(p) > max_prompt]
        if too_long:
            raise UserError(f"--prompts {path}: line {too_long[0] + 1} is over {max_prompt} tokens")
        return ids, f"--prompts ({len(ids)} lines)"
    lengths = rng.integers(2, max(3, max_prompt // 2), n)
    return [rng.integers(0, vocab, k).tolist() for k in lengths], f"{n} random token sequences"


def decode_ready_skipped(config) -> str | None:
    """Why this project's decode-ready export is not built for `config` (None: it is)."""
    if config.model_type not in LLAMA_FAMILY:
        return f"the decode-ready export covers {', '.join(LLAMA_FAMILY)}, not {config.model_type}"
    return None


@register_kind("causal-lm")
class CausalLMKind(ModelKind):
    """A Hugging Face causal-LM folder (config.json, safetensors, tokenizer.json): a .litertlm bundle
    per target (and the decode-ready export for the Llama family), judged by greedy token agreement."""

    detect_order = 0  # config.json naming a *ForCausalLM head, and tokenizer.json; before the other kinds
    noun = "a causal LM"
    refused_options = {
        "input_shapes": NOT_FOR_HF, "model_class": NOT_FOR_HF, "model_kwargs": NOT_FOR_HF, "trust_pickle": NOT_FOR_HF,
        "calib": "does not apply to a causal LM: static int8 of a KV-cache LM is not built, its targets use float "
                 "or weight/dynamic int8 and int4 recipes (profile lm_precisions)",
        "eval_data": "does not apply to a causal LM: its parity inputs are prompts (pass --prompts FILE, one per line)",
        "metric": "does not apply to a causal LM: it scores labelled --eval-data rows of a fixed-shape model",
    }
    app_files = True  # the LM snippets (snippets.py) run model.litertlm with LiteRT-LM's Kotlin/Swift API

    def __init__(self, path: Path, model: torch.nn.Module, prompts: list[list[int]], source: str, max_len: int,
                 prefill_len: int, tokenizer: Tokenizer):
        self.path, self.model, self.prompts, self.sample_source = path, model, prompts, source
        self.max_len, self.prefill_len, self.tokenizer = max_len, prefill_len, tokenizer
        # The decode-ready export (and with it the browser page and the reference client) covers the Llama
        # family (1, 2 or all kv heads; Mistral's and Qwen2's sliding windows). Other families get the
        # bundle only.
        self.decode_ready_skipped = decode_ready_skipped(model.config)
        self.decode_ready = self.decode_ready_skipped is None
        # what an app sends: the prompts as text (litert_lm tokenizes with the bundle's tokenizer)
        self.texts = [t for t in (tokenizer.decode(p, skip_special_tokens=True) for p in prompts) if t.strip()]
        self.meta: dict = {}
        self.torch_ms: float | None = None
        # held-out text for perplexity (quant_recipes.HELDOUT_LINES the tokenizer represents)
        self.heldout = heldout_sequences(tokenizer, max_len)
        self.torch_ppl: float | None = None
        self.torch_logits: list[np.ndarray] | None = None  # PyTorch's held-out logits (teacher-forced reference)
        # bundle sha256 -> litert_lm figures + perplexity (or the error): targets sharing a recipe measure it once
        self.measured: dict[str, dict | ConversionError] = {}
        # the task an rl policy was trained on (ConvertOptions.lm_task, task_accuracy.py) and PyTorch's figures on it
        self.task: task_accuracy.LMTask | None = None
        self.max_drop_given: dict[str, float] = {}  # --max-task-drop: target (or every target) -> bound
        self.task_torch: dict | None = None

    @staticmethod
    def detect(path: Path) -> bool:
        return is_causal_lm_folder(path)

    @classmethod
    def skip_reason(cls, profile: TargetProfile) -> str | None:
        if profile.causal_lm:
            return None
        return "decode-ready LMs are not built for this target (profile causal_lm = false)"

    @classmethod
    def load(cls, path: Path, o: ConvertOptions, rng: np.random.Generator, say: Progress) -> CausalLMKind:
        say("load: Hugging Face causal LM (safetensors; no code from the folder runs)")
        model = load_hf_causal_lm(path)
        litertlm.check_family(model.config)
        max_len, prefill_len = cache_lengths(model.config, o.lm_max_len, o.lm_prefill_len)
        positions = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
        if positions and max_len > positions:
            raise UserError(f"--max-len {max_len} is over the model's {positions} positions (max_position_embeddings)")
        tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        prompts, source = read_prompts(o.prompts, tokenizer, o.samples or PROMPTS_DEFAULT, model.config.vocab_size,
                                       max_len - MAX_NEW_TOKENS, rng)
        kind = cls(path, model, prompts, source, max_len, prefill_len, tokenizer)
        kind.task = o.lm_task
        kind.max_drop_given = o.max_task_drop or {}  # parsed per target by the pipeline
        if kind.max_drop_given and kind.task is None:
            raise UserError("--max-task-drop does not apply here: a causal LM has a task score only as an rl policy "
                            "(a folder `tpu-pipeline rl` saved, with tpu_pipeline_rl.json)")
        return kind

    def export_float(self, work: Path, say: Progress) -> Artifact:
        say("export: float32 .litertlm bundle (litert-torch export_hf, child process)")
        bundle = litertlm.export_bundle(self.path, work, cache_length=self.max_len, prefill_length=self.prefill_len)
        if not self.decode_ready:
            tokenizer = {n: (self.path / n).read_bytes() for n in TOKENIZER_FILES if (self.path / n).is_file()}
            return Artifact(model=litertlm.bundle_tflite(bundle), extra_files={**tokenizer, litertlm.BUNDLE_FILE: bundle})
        say("export: decode-ready float32 .tflite (prefill + decode, KV cache), traced once")
        out = work / "float"
        try:
            with quiet_native(work / "export.log"):
                self.meta = write_decode_ready(self.path, out, max_len=self.max_len, prefill_len=self.prefill_len,
                                               model=self.model)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - the converter's own failures
            raise ConversionError(f"litert-torch could not export the LM: {type(e).__name__}: "
                                  f"{str(e).splitlines()[0]}") from None
        extra = {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != "model.tflite"}
        return Artifact(model=(out / "model.tflite").read_bytes(), extra_files={**extra, litertlm.BUNDLE_FILE: bundle})

    def precision(self, profile: TargetProfile) -> str:
        return profile.lm_precision or profile.precision

    def candidates(self, profile: TargetProfile) -> list[str]:
        return list(profile.lm_precisions) or [self.precision(profile)]

    def variant(self, float_model: Artifact, precision: str) -> Artifact:
        if precision not in LM_RECIPES:
            raise ConversionError(f"{precision} is not an LM recipe (static int8 needs calibration of a KV-cache LM, "
                                  f"which is not built); use one of {', '.join(e.name for e in LM_RECIPES.entries())}")
        bundle = litertlm.bundle_variant(float_model.extra_files[litertlm.BUNDLE_FILE], precision)
        extra = {**float_model.extra_files, litertlm.BUNDLE_FILE: bundle}
        if not self.decode_ready:
            return Artifact(model=litertlm.bundle_tflite(bundle), extra_files=extra, precision=precision)
        return Artifact(model=quantize_lm(float_model.model, precision, signature="prefill"), extra_files=extra,
                        precision=precision)

    def _runtime(self, art: Artifact, folder: Path) -> LiteRTLanguageModel:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.tflite").write_bytes(art.model)
        for name, data in art.extra_files.items():
            (folder / name).write_bytes(data)
        return LiteRTLanguageModel(folder, num_threads=MEASURE_THREADS)

    def _measure_bundle(self, bundle: bytes, work: Path, say: Progress) -> dict:
        """Greedy generations through litert_lm and held-out perplexity of one bundle, measured once
        per bundle (targets that share a recipe share the figures); ConversionError when litert_lm
        or ai-edge-litert cannot run it (e.g. a recipe whose kernels the CPU runtime lacks)."""
        key = hashlib.sha256(bundle).hexdigest()
        if key not in self.measured:
            try:
                self.measured[key] = self._measure(bundle, work, say)
            except ConversionError as e:
                self.measured[key] = e
        got = self.measured[key]
        if isinstance(got, ConversionError):
            raise got
        return got

    def _measure(self, bundle: bytes, work: Path, say: Progress) -> dict:
        say(f"greedy generations of model.litertlm through litert_lm on {len(self.texts)} prompts")
        (work / "litertlm").mkdir(parents=True, exist_ok=True)
        eos = eos_token_ids(self.model)
        pad = self.model.config.pad_token_id
        try:
            fig = litertlm.bundle_parity(self.model, self.tokenizer, bundle, self.texts,
                                         max_new_tokens=MAX_NEW_TOKENS, cache_length=self.max_len, eos_ids=eos,
                                         pad_id=(eos or [0])[0] if pad is None else pad, work=work / "litertlm",
                                         threads=MEASURE_THREADS)
        except RuntimeError as e:  # the engine loads the bundle but cannot run it (its last line says why)
            lines = [ln.strip(" \u2502\u2514\u251c\u2500") for ln in str(e).splitlines() if ln.strip()] or ["no message"]
            raise ConversionError(f"litert_lm could not run model.litertlm: {lines[-1][:200]}") from None
        say(f"held-out perplexity on {len(self.heldout)} lines (the bundle's graph on ai-edge-litert)")
        fig["perplexity"] = self._perplexity(bundle)
        if self.task is not None:
            try:
                fig["task"] = self._task(bundle, work, say)
            except UserError as e:  # a task this bundle cannot be fed (chat-template prompts): said, not failed
                fig["task_skipped"] = str(e)
        return fig

    def _task(self, bundle: bytes, work: Path, say: Progress) -> dict:
        """The bundle's accuracy on the rl policy's task through litert_lm, beside PyTorch's."""
        if self.task_torch is None:
            say(f"task {self.task.name}: PyTorch's greedy accuracy on {self.task.describe()['problems']} held-out problems")
            self.task_torch = task_accuracy.torch_accuracy(self.task, self.path)
        say(f"task {self.task.name}: model.litertlm's greedy accuracy through litert_lm")
        try:
            return task_accuracy.bundle_accuracy(self.task, bundle, work / "task", self.task_torch,
                                                 max_num_tokens=self.max_len, threads=MEASURE_THREADS)
        except RuntimeError as e:  # the engine loads the bundle but cannot run a prompt (its last line says why)
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or ["no message"]
            raise ConversionError(f"litert_lm could not answer the task's prompts: {lines[-1][:200]}") from None

    def _perplexity(self, bundle: bytes) -> dict:
        """The bundle's held-out perplexity next to PyTorch's float32 one (quant_recipes.py)."""
        base = {"text": "tpu_pipeline.convert.lm.quant_recipes.HELDOUT_LINES", "lines": len(self.heldout),
                "tokens": sum(len(s) - 1 for s in self.heldout)}
        if not self.heldout:
            return {**base, "torch": None, "artifact": None, "change": None,
                    "skipped": "the tokenizer represents none of the held-out lines"}
        if self.torch_ppl is None:
            self.torch_logits = torch_logits(self.model, self.heldout)
            self.torch_ppl = perplexity(self.torch_logits, self.heldout)
        try:
            logits = litertlm.decode_logits(litertlm.bundle_tflite(bundle), self.heldout)
        except (RuntimeError, ValueError) as e:
            raise ConversionError(f"ai-edge-litert could not run the bundle's graph for perplexity: "
                                  f"{str(e).splitlines()[0][:200]}") from None
        got = tflite_perplexity(logits, self.heldout)
        if got is not None:
            tf = teacher_forced(self.torch_logits, logits, self.heldout)
            agree = round(tf["top1_agreement"] * tf["tokens"])
            base["teacher_forced"] = {**tf, "top1_interval": wilson(agree, tf["tokens"])}
        if got is None:
            return {**base, "torch": self.torch_ppl, "artifact": None, "change": None,
                    "skipped": "the decode signature has inputs beyond tokens/positions/mask/KV cache (a sliding-"
                               "window mask); it is not driven token by token here"}
        return {**base, "torch": self.torch_ppl, "artifact": got, "change": got / self.torch_ppl - 1}

    def _bundle_parity(self, prof: TargetProfile, art: Artifact, work: Path, say: Progress) -> tuple[dict, list[str]]:
        bundle = art.extra_files[litertlm.BUNDLE_FILE]
        say(f"{prof.name}: model.litertlm on litert_lm")
        fig = self._measure_bundle(bundle, work, say)
        ppl = fig["perplexity"]
        tf = ppl.get("teacher_forced")
        if art.precision in FLOAT_RECIPES or tf is None:
            # float bundles: greedy tokens are the rule (float32 noise decides no token of a real prompt)
            reasons = litertlm.verdict(fig, prof.min_generation_agreement)
            fig["judged_by"] = "greedy generations" + ("" if art.precision in FLOAT_RECIPES else
                                                       " (teacher-forced logits could not be read)")
        else:
            # quantized bundles: a greedy run's first flip changes every token after it, and the near-tie
            # rule measured against the variant's own error forgave a weight-only int8 Phi-3 at greedy
            # agreement 0.375 (issue 19); held-out text teacher-forced judges every position instead
            fig["judged_by"] = "teacher-forced next-token top-1 agreement and mean KL vs float on held-out text"
            reasons = []
            if tf["top1_agreement"] < prof.min_teacher_forced_top1:
                reasons.append(f"teacher-forced next-token top-1 agreement {tf['top1_agreement']:.3f} (95% CI "
                               f"{tf['top1_interval'][0]:.3f}-{tf['top1_interval'][1]:.3f}) over {tf['tokens']} "
                               f"held-out tokens < {prof.min_teacher_forced_top1}")
            if tf["mean_kl"] > prof.max_mean_kl:
                reasons.append(f"mean KL(float || {art.precision}) {tf['mean_kl']:.4g} nats per held-out token "
                               f"> {prof.max_mean_kl}")
        # either way: a lower perplexity on random weights means the variant departs from float just as much
        if ppl["change"] is not None and abs(ppl["change"]) > prof.max_perplexity_change:
            reasons.append(f"held-out perplexity {ppl['artifact']:.4f} vs PyTorch {ppl['torch']:.4f} "
                           f"({ppl['change']:+.2%}; bound +-{prof.max_perplexity_change:.2%})")
        if "task" in fig:  # an rl policy: the task it was trained for decides too, whatever the recipe
            reasons += task_accuracy.verdict(fig["task"], self._max_drop(prof), self.task.name)
        return fig, reasons

    def _task_figures(self, bundle: dict, prof: TargetProfile) -> dict:
        """report.json targets.*.parity.lm_task: the bundle's task accuracy beside PyTorch's and the bound."""
        if "task" not in bundle:
            return {}
        fig = bundle["task"]
        bound = self._max_drop(prof)
        return {"lm_task": {**fig, "task": self.task.name, "max_task_drop": bound,
                            "passed": not task_accuracy.verdict(fig, bound, self.task.name)}}

    def _max_drop(self, prof: TargetProfile) -> float:
        """--max-task-drop for this target (or for every target), else the profile's."""
        given = self.max_drop_given
        return given.get(prof.name, given.get(task_score.ALL_TARGETS, prof.max_task_drop))

    @staticmethod
    def _recipe(bundle_fig: dict, bundle: bytes, prof: TargetProfile) -> dict:
        """What the pipeline adds to each candidate (report.json targets.*.candidates[], report.html's
        side-by-side table): the figures an LM recipe is chosen by."""
        ppl = bundle_fig["perplexity"]
        tf = ppl.get("teacher_forced") or {}
        return {"bundle_size_bytes": len(bundle), "generation_agreement": bundle_fig["generation_agreement"],
                "teacher_forced_top1": tf.get("top1_agreement"), "mean_kl": tf.get("mean_kl"),
                "near_ties": bundle_fig["near_ties"], "agreement_with_near_ties": bundle_fig["agreement_with_near_ties"],
                "perplexity": ppl["artifact"], "perplexity_torch": ppl["torch"], "perplexity_change": ppl["change"],
                "max_perplexity_change": prof.max_perplexity_change,
                **({"task_accuracy": bundle_fig["task"]["accuracy"]} if "task" in bundle_fig else {})}

    def parity(self, prof: TargetProfile, art: Artifact, info: ModelInfo, o: ConvertOptions, work: Path,
               say: Progress) -> Parity:
        bundle, bundle_reasons = self._bundle_parity(prof, art, work, say)
        skipped_ppl = bundle["perplexity"].get("skipped")
        ppl_warnings = [f"held-out perplexity not measured: {skipped_ppl}"] if skipped_ppl else []
        if "task_skipped" in bundle:
            ppl_warnings.append(f"task accuracy not measured: {bundle['task_skipped']}")
        if not self.decode_ready:
            warnings = ppl_warnings + ([f"browser parity skipped: the in-browser page drives the decode-ready export "
                                        f"({self.decode_ready_skipped})"] if prof.browser_parity else [])
            figures = {"passed": not bundle_reasons, "reasons": bundle_reasons, "runtime": "litert_lm",
                       **{k: bundle[k] for k in ("prompts", "generation_agreement", "first_generation_divergence")},
                       "litert_lm": bundle, "max_new_tokens": MAX_NEW_TOKENS,
                       "lm_recipe": self._recipe(bundle, art.extra_files[litertlm.BUNDLE_FILE], prof),
                       **self._task_figures(bundle, prof),
                       "tolerances": {"min_generation_agreement": prof.min_generation_agreement,
                                      "max_perplexity_change": prof.max_perplexity_change}}
            return Parity(figures=figures, warnings=warnings, runtime=litertlm.RUNTIME)
        say(f"{prof.name}: greedy generations on {len(self.prompts)} prompts vs PyTorch")
        gen = generation_parity(self.model, self._runtime(art, work), self.prompts, MAX_NEW_TOKENS)
        ref_ids = gen.pop("ref_ids")
        logits = parity.compare(gen.pop("ref_logits"), gen.pop("got_logits"), kind="token_logits",
                                atol=o.atol if o.atol is not None else prof.atol,
                                rtol=o.rtol if o.rtol is not None else prof.rtol)
        ok_logits, reasons = parity.judge({"logits": logits}, prof, atol=o.atol, rtol=o.rtol, min_cosine=o.min_cosine)
        runtime, warnings, browser = RUNTIME, list(ppl_warnings), None
        if prof.browser_parity:
            browser = self._browser_generations(prof, work, ref_ids, say)
            if "skipped" in browser:
                warnings.append(f"browser parity skipped: {browser['skipped']}")
            else:
                runtime += "; LiteRT.js (wasm) in headless Chromium"
                if browser["generation_agreement"] < prof.min_generation_agreement:
                    ok_logits = False
                    reasons.append(f"in the browser (LiteRT.js): greedy generations agree on "
                                   f"{browser['generation_agreement']:.0%} of prompts")
        # greedy generations decide for float artifacts; quantized ones are judged teacher-forced on
        # held-out text (the bundle's figures above), their greedy agreement reported beside
        ok_gen = gen["generation_agreement"] >= prof.min_generation_agreement or art.precision not in FLOAT_RECIPES
        if not ok_gen:
            d = gen["first_generation_divergence"]
            reasons.insert(0, f"greedy generations agree on {gen['generation_agreement']:.0%} of prompts "
                              f"(need {prof.min_generation_agreement:.0%}); first divergence: prompt {d['prompt']}, "
                              f"token {d['token_index']} (torch {d['torch']}, litert {d['litert']})")
        tolerances = {**parity.tolerances(prof, o.atol, o.rtol, o.min_cosine),
                      "min_generation_agreement": prof.min_generation_agreement,
                      "max_perplexity_change": prof.max_perplexity_change}
        figures = {"passed": ok_gen and ok_logits and not bundle_reasons, "reasons": reasons + bundle_reasons,
                   "runtime": "ai-edge-litert", "litert_lm": bundle, **({"browser": browser} if browser else {}),
                   "lm_recipe": self._recipe(bundle, art.extra_files[litertlm.BUNDLE_FILE], prof),
                   **self._task_figures(bundle, prof),
                   **gen, "max_new_tokens": MAX_NEW_TOKENS, "outputs": {"logits": logits}, "tolerances": tolerances,
                   **{k: logits[k] for k in ("max_abs", "rmse", "cosine", "snr_db", "top1") if k in logits}}
        return Parity(figures=figures, warnings=warnings, runtime=f"{runtime}; {litertlm.RUNTIME}")

    def _browser_generations(self, prof: TargetProfile, artifact_dir: Path, ref_ids, say: Progress) -> dict:
        """The web target's greedy generations in headless Chromium (LiteRT.js)."""
        reason = browser_unavailable()
        if reason:
            return {"skipped": reason}
        say(f"{prof.name}: greedy generations in headless Chromium (LiteRT.js)")
        got = generate_litertjs(artifact_dir / "model.tflite", self.meta, self.prompts, MAX_NEW_TOKENS)
        agree = sum(g == ref for g, ref in zip(got, ref_ids))
        return {"runtime": "LiteRT.js (@litertjs/core, wasm) in headless Chromium", "prompts": len(self.prompts),
                "generation_agreement": agree / max(1, len(self.prompts))}

    def latency(self, art: Artifact, info: ModelInfo, work: Path) -> dict:
        """Milliseconds per generated token, greedy, the first prompt's prefill included, one
        thread on both sides; PyTorch runs transformers' generate with its KV cache. `litert_lm`:
        the bundle on LiteRT-LM (ms per token the same way, and the engine's own tokens/s)."""
        bundle = litertlm.latency(art.extra_files[litertlm.BUNDLE_FILE], self.texts[0], MAX_NEW_TOKENS,
                                  work / "litertlm", max_num_tokens=self.max_len, threads=MEASURE_THREADS)
        prompt = self.prompts[0]
        if not self.decode_ready:
            n = bundle["tokens"]
            self._torch_ms(prompt, n)
            return {"artifact": bundle["ms_per_token"], "torch_eager": self.torch_ms, "threads": MEASURE_THREADS,
                    "speedup_vs_torch": self.torch_ms / bundle["ms_per_token"] if bundle["ms_per_token"] else None,
                    "runtime": litertlm.RUNTIME, "unit": "ms per generated token (greedy, prefill included)",
                    "tokens": n, "litert_lm": bundle}
        lm = self._runtime(art, work)
        n = len(lm.generate_ids(prompt, MAX_NEW_TOKENS))
        art_ms = median_ms(lambda: lm.generate_ids(prompt, MAX_NEW_TOKENS)) / n
        self._torch_ms(prompt, n)
        return {"artifact": art_ms, "torch_eager": self.torch_ms, "threads": MEASURE_THREADS,
                "speedup_vs_torch": (self.torch_ms / art_ms) if art_ms else None,
                "runtime": "ai-edge-litert (XNNPACK)", "unit": "ms per generated token (greedy, prefill included)",
                "tokens": n, "litert_lm": bundle}

    def _torch_ms(self, prompt: list[int], n: int) -> None:
        if self.torch_ms is None:
            ids = torch.tensor([prompt])
            pad = (eos_token_ids(self.model) or [0])[0]
            with torch.no_grad(), torch_threads():
                # the mask given: with pad == eos Transformers cannot infer it and warns on every call
                self.torch_ms = median_ms(lambda: self.model.generate(
                    ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                    pad_token_id=pad)) / n

    def model_json(self, r: TargetResult) -> dict:
        bundle = r.artifact.extra_files.get(litertlm.BUNDLE_FILE) if r.artifact else None
        return {"format": "tpu-pipeline/litert-artifact@1",
                "kind": "decode-ready-lm" if self.decode_ready else "litert-lm-bundle", "target": r.target,
                "passed": r.passed, "quantization": r.quantization, "runtime": r.runtime,
                "size_bytes": r.size_bytes, "sha256": r.sha256, "lm": META_FILE if self.decode_ready else None,
                "litertlm": {"file": litertlm.BUNDLE_FILE, "size_bytes": len(bundle), "cache_length": self.max_len,
                             "prefill_length": self.prefill_len, "exporter": "litert-torch export_hf",
                             "sampler": litertlm.sampler_defaults(bundle)}
                if bundle else None,
                "tokenizer": [n for n in TOKENIZER_FILES if n in r.artifact.extra_files],
                "parity": r.parity, "latency_ms": r.latency_ms, "errors": r.errors, "warnings": r.warnings}

    def report_fields(self) -> dict:
        exports = "decode-ready export and .litertlm bundle" if self.decode_ready else ".litertlm bundle"
        return {"source_format": f"Hugging Face causal-LM folder ({exports})", "task": "causal-lm",
                "lm": {k: self.meta.get(k) for k in ("max_len", "prefill_len", "cache_shape", "eos_token_ids")},
                "samples": len(self.prompts), "sample_source": self.sample_source,
                **({"lm_task": {**self.task.describe(), "torch": task_accuracy.public(self.task_torch)}}
                   if self.task is not None and self.task_torch is not None else {}),
                "notes": [f"model.litertlm only: {self.decode_ready_skipped}; the target's model.tflite is the "
                          f"bundle's own prefill/decode graph"] if self.decode_ready_skipped else []}
