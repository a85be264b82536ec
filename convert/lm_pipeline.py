"""`convert` for a Hugging Face causal-LM folder: a decode-ready artifact
(prefill + decode signatures, explicit KV cache, tokenizer beside it) per
target that takes LMs, proven by greedy generations that agree with PyTorch
token for token, plus the usual metrics on the prefill logits.

Exported once in float32; each target's precision is derived from that file
with ai-edge-quantizer, as for any other model.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from tpu_pipeline import files
from tpu_pipeline.errors import ConversionError, UserError

from . import parity
from .browser import browser_unavailable, generate_litertjs
from .export import quiet_native
from .lm_export import TOKENIZER_FILES, generation_parity, load_hf_causal_lm, write_decode_ready
from .lm_runtime import META_FILE, LiteRTLanguageModel
from .quantize import quantize
from .report import render_html

MAX_NEW_TOKENS = 16


def is_causal_lm_folder(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file() and (path / "tokenizer.json").is_file()


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


def convert_lm(model_path: Path, o, profiles, out: Path, say) -> tuple[dict, list[str]]:
    """-> (report, failed target names). Writes `out` through a staging folder."""
    from tokenizers import Tokenizer

    t0 = time.perf_counter()
    wanted = [p for p in profiles if p.causal_lm]
    skipped = {p.name: "decode-ready LMs are not built for this target (profile causal_lm = false)"
               for p in profiles if not p.causal_lm}
    if not wanted:
        raise UserError(f"none of the targets {', '.join(skipped)} takes a causal LM; choose from targets "
                        "whose profile has causal_lm = true")
    say("load: Hugging Face causal LM (safetensors; no code from the folder runs)")
    model = load_hf_causal_lm(model_path)
    tokenizer = Tokenizer.from_file(str(model_path / "tokenizer.json"))
    rng = np.random.default_rng(o.seed)
    with tempfile.TemporaryDirectory(prefix="tpu-pipeline-lm-") as work, files.staged_dir(out) as stage:
        work = Path(work)
        say("export: decode-ready float32 .tflite (prefill + decode, KV cache), traced once")
        t_exp = time.perf_counter()
        try:
            with quiet_native(work / "export.log"):
                meta = write_decode_ready(model_path, work / "float", max_len=o.lm_max_len,
                                          prefill_len=o.lm_prefill_len)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - the converter's own failures
            raise ConversionError(f"litert-torch could not export the LM: {type(e).__name__}: {str(e).splitlines()[0]}") from None
        export_s = time.perf_counter() - t_exp
        prompts, source = read_prompts(o.prompts, tokenizer, o.samples, meta["vocab_size"],
                                       meta["max_len"] - MAX_NEW_TOKENS, rng)
        float_model = (work / "float" / "model.tflite").read_bytes()
        report = {"model": str(model_path), "source_format": "Hugging Face causal-LM folder (decode-ready export)",
                  "task": "causal-lm", "lm": {k: meta[k] for k in ("max_len", "prefill_len", "cache_shape", "eos_token_ids")},
                  "samples": len(prompts), "sample_source": source, "notes": [], "warnings": [],
                  "export_s": export_s, "targets": {}, "skipped_targets": skipped}
        variants: dict[str, bytes] = {}
        for prof in wanted:
            report["targets"][prof.name] = _lm_target(prof, model, float_model, work, stage, out, prompts,
                                                      variants, say)
        report["wall_s"] = time.perf_counter() - t0
        report["passed"] = all(t["passed"] for t in report["targets"].values())
        files.atomic_write_json(stage / "report.json", report)
        files.atomic_write_text(stage / "report.html", render_html(report))
    report["out"] = str(out)
    return report, [n for n, t in report["targets"].items() if not t["passed"]]


def _browser_generations(prof, artifact_dir: Path, prompts, ref_ids, r: dict, say) -> dict:
    """The web target's greedy generations in headless Chromium (LiteRT.js)."""
    import json

    reason = browser_unavailable()
    if reason:
        r["warnings"].append(f"browser parity skipped: {reason}")
        return {"skipped": reason}
    say(f"{prof.name}: greedy generations in headless Chromium (LiteRT.js)")
    meta = json.loads((artifact_dir / META_FILE).read_text())
    got = generate_litertjs(artifact_dir / "model.tflite", meta, prompts, MAX_NEW_TOKENS)
    agree = sum(g == ref for g, ref in zip(got, ref_ids))
    r["runtime"] += "; LiteRT.js (wasm) in headless Chromium"
    return {"runtime": "LiteRT.js (@litertjs/core, wasm) in headless Chromium", "prompts": len(prompts),
            "generation_agreement": agree / max(1, len(prompts))}


def _lm_target(prof, model, float_model: bytes, work: Path, stage: Path, out: Path, prompts, variants, say) -> dict:
    precision = prof.lm_precision or prof.precision
    r = {"target": prof.name, "quantization": precision, "passed": False, "errors": [], "warnings": [],
         "runtime": "ai-edge-litert XNNPACK (prefill/decode signatures)", "size_bytes": None, "parity": None}
    if precision == "static_int8":
        r["errors"].append("static int8 needs calibration of a KV-cache LM, which is not built; use a float or "
                           "dynamic int8 profile")
        r["failure"] = "conversion"
        return r
    try:
        if precision not in variants:
            say(f"{prof.name}: quantize ({precision}, ai-edge-quantizer)")
            variants[precision] = quantize(float_model, precision, None, signature="prefill")
        art = variants[precision]
    except ConversionError as e:
        r["errors"].append(str(e))
        r["failure"] = "conversion"
        return r
    r["size_bytes"] = len(art)
    if prof.max_size_bytes and len(art) > prof.max_size_bytes:
        r["errors"].append(f"artifact is {len(art)} bytes, over the {prof.name} budget of {prof.max_size_bytes}")
        r["failure"] = "compatibility"
        return r
    sub = work / prof.name
    shutil.copytree(work / "float", sub)
    (sub / "model.tflite").write_bytes(art)
    say(f"{prof.name}: greedy generations on {len(prompts)} prompts vs PyTorch")
    gen = generation_parity(model, LiteRTLanguageModel(sub, num_threads=1), prompts, MAX_NEW_TOKENS)
    ref_ids = gen.pop("ref_ids")
    logits = parity.compare(gen.pop("ref_logits"), gen.pop("got_logits"), classifier=True, atol=prof.atol, rtol=prof.rtol)
    ok_logits, reasons = parity.judge({"logits": logits}, prof)
    browser = _browser_generations(prof, sub, prompts, ref_ids, r, say) if prof.browser_parity else None
    if browser and browser["generation_agreement"] < prof.min_generation_agreement:
        ok_logits = False
        reasons.append(f"in the browser (LiteRT.js): greedy generations agree on "
                       f"{browser['generation_agreement']:.0%} of prompts")
    ok_gen = gen["generation_agreement"] >= prof.min_generation_agreement
    if not ok_gen:
        d = gen["first_generation_divergence"]
        reasons.insert(0, f"greedy generations agree on {gen['generation_agreement']:.0%} of prompts "
                          f"(need {prof.min_generation_agreement:.0%}); first divergence: prompt {d['prompt']}, "
                          f"token {d['token_index']} (torch {d['torch']}, litert {d['litert']})")
    r["parity"] = {"passed": ok_gen and ok_logits, "reasons": reasons, "runtime": "ai-edge-litert",
                   **({"browser": browser} if browser else {}),
                   **gen, "max_new_tokens": MAX_NEW_TOKENS, "outputs": {"logits": logits},
                   **{k: logits[k] for k in ("max_abs", "rmse", "cosine", "snr_db", "top1") if k in logits}}
    r["passed"] = r["parity"]["passed"]
    if not r["passed"]:
        r["failure"] = "parity"
        r["errors"] += reasons
    dest = stage / prof.name / ("" if r["passed"] else "failed")
    shutil.copytree(sub, dest)
    r["artifact"] = str(out / prof.name / ("" if r["passed"] else "failed") / "model.tflite")
    r["sha256"] = files.sha256_file(dest / "model.tflite")
    model_json = {"format": "tpu-pipeline/litert-artifact@1", "kind": "decode-ready-lm", "target": prof.name,
                  "passed": r["passed"], "quantization": precision, "runtime": r["runtime"],
                  "size_bytes": r["size_bytes"], "sha256": r["sha256"], "lm": META_FILE,
                  "tokenizer": [n for n in TOKENIZER_FILES if (dest / n).is_file()],
                  "parity": r["parity"], "errors": r["errors"]}
    files.atomic_write_json(dest / "model.json", model_json)
    return r
