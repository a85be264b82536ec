"""LM quantization recipes side by side on the app's runtime (issue 12 item 4, measured, not wired).

One float32 .litertlm (litert-torch export_hf) of a Hugging Face causal LM;
each recipe quantizes the bundle's .tflite with ai-edge-quantizer and repacks
it (convert/litertlm.py). Per recipe: bundle size, greedy token agreement with
transformers through litert_lm (near-tie rule), and perplexity on held-out
arithmetic text from the variant's own logits (its .tflite teacher-forced on
ai-edge-litert), next to PyTorch's perplexity on the same tokens.

Default model: the default grpo_math policy architecture (tests/convert/lm_zoo.py,
random weights unless --hf names a trained policy folder such as
runs/demo/grpo_math/policy). Writes OUT/lm_recipes.json and OUT/lm_recipes.md.

CPU command (one export, a few minutes):
    .venv/bin/python bench/lm_recipes.py --out /tmp/lm_recipes [--hf runs/demo/grpo_math/policy]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import tempfile
from pathlib import Path

import torch
from ai_edge_quantizer import quantizer, recipe
from tokenizers import Tokenizer

from tpu_pipeline.convert import litertlm
from tpu_pipeline.convert.lm_export import eos_token_ids, load_hf_causal_lm
from tpu_pipeline.convert.quantize import recipe_for
from tpu_pipeline.train.arith import heldout_problems, target_text

REPO = Path(__file__).resolve().parent.parent
CACHE, PREFILL, NEW_TOKENS, HELDOUT = 64, 16, 16, 64
# name -> ai-edge-quantizer recipe (None: the float32 bundle itself)
RECIPES = {
    "float32": None,
    "float16": recipe_for("float16"),
    "dynamic_int8": recipe.dynamic_wi8_afp32(),
    "weight_only_int8": recipe.weight_only_wi8_afp32(),
    "weight_only_int4": recipe.weight_only_wi4_afp32(),
    "dynamic_int4_block32": recipe.dynamic_wi4b32_afp32(),
}


def load_zoo():
    spec = importlib.util.spec_from_file_location("tpu_pipeline_lm_zoo", REPO / "tests" / "convert" / "lm_zoo.py")
    zoo = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = zoo
    spec.loader.exec_module(zoo)
    return zoo


def variant(bundle: bytes, r) -> bytes:
    if r is None:
        return bundle
    q = quantizer.Quantizer(bytearray(litertlm.bundle_tflite(bundle)), r)
    return litertlm.repack(bundle, bytes(q.quantize(None, enable_progress_report=False).quantized_model))


def bundle_perplexity(bundle: bytes, tok: Tokenizer, pairs: list[tuple[str, str]]) -> float:
    """exp(mean NLL) of each target given its prompt, from the bundle's own .tflite logits
    (teacher-forced decode on ai-edge-litert: the graph litert_lm runs). litert_lm's
    Session.run_text_scoring was tried first: its per-token scores differ from PyTorch's
    log-probs by up to 1.2 nats on a float32 bundle whose greedy text matches exactly, so it
    is not used."""
    seqs = [(tok.encode(p).ids, tok.encode(t, add_special_tokens=False).ids) for p, t in pairs]
    logits = litertlm.decode_logits(litertlm.bundle_tflite(bundle), [p + t for p, t in seqs])
    nll, n = 0.0, 0
    for (p, t), lg in zip(seqs, logits):
        logp = torch.log_softmax(torch.from_numpy(lg).double(), -1)
        nll -= sum(float(logp[len(p) - 1 + i, tid]) for i, tid in enumerate(t))
        n += len(t)
    return math.exp(nll / n)


def torch_perplexity(model, tok: Tokenizer, pairs: list[tuple[str, str]]) -> float:
    nll, n = 0.0, 0
    for prompt, target in pairs:
        p = tok.encode(prompt).ids
        t = tok.encode(target, add_special_tokens=False).ids
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([p + t])).logits[0].float(), -1)
        nll -= sum(float(logp[len(p) - 1 + i, tid]) for i, tid in enumerate(t))
        n += len(t)
    return math.exp(nll / n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/bench_lm_recipes"))
    ap.add_argument("--hf", type=Path, default=None, help="HF causal-LM folder (default: grpo_math policy shape)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    zoo = load_zoo()
    with tempfile.TemporaryDirectory(prefix="lm-recipes-") as tmp:
        work = Path(tmp)
        folder = args.hf or zoo.save_grpo_policy_shape(work / "hf")
        model = load_hf_causal_lm(folder)
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        eos = eos_token_ids(model)
        eos_text = tok.id_to_token(eos[0]) if eos else ""
        pairs = [(p.prompt, target_text(p.answer) + eos_text) for p in heldout_problems(HELDOUT)]
        bundle = litertlm.export_bundle(folder, work, cache_length=CACHE, prefill_length=PREFILL)
        rows = {"model": str(args.hf or "grpo_math policy shape, random weights"), "heldout_pairs": len(pairs),
                "torch_perplexity": torch_perplexity(model, tok, pairs), "recipes": {}}
        for name, r in RECIPES.items():
            b = variant(bundle, r)
            sub = work / name
            sub.mkdir()
            try:
                par = litertlm.bundle_parity(model, tok, b, list(zoo.PROMPTS), max_new_tokens=NEW_TOKENS,
                                             cache_length=CACHE, eos_ids=eos, pad_id=0, work=sub)
                rows["recipes"][name] = {
                    "size_bytes": len(b), "perplexity": bundle_perplexity(b, tok, pairs),
                    **{k: par[k] for k in ("generation_agreement", "near_ties", "agreement_with_near_ties",
                                           "logit_max_abs", "first_generation_divergence")}}
            except RuntimeError as e:  # litert_lm cannot run this variant: that is the result
                rows["recipes"][name] = {"size_bytes": len(b), "error": str(e).replace("\n", " ")[:200]}
            print(name, json.dumps(rows["recipes"][name]), flush=True)
    (args.out / "lm_recipes.json").write_text(json.dumps(rows, indent=1))
    lines = [f"Model: {rows['model']}; held-out pairs: {len(pairs)}; PyTorch perplexity "
             f"{rows['torch_perplexity']:.4f}", "",
             "| recipe | bundle KB | greedy agreement (near-ties) | perplexity | change vs PyTorch |",
             "|---|---|---|---|---|"]
    base = rows["torch_perplexity"]
    for name, r in rows["recipes"].items():
        if "error" in r:
            lines.append(f"| {name} | {r['size_bytes'] / 1024:.0f} | does not run on litert_lm: {r['error']} | | |")
            continue
        lines.append(f"| {name} | {r['size_bytes'] / 1024:.0f} | {r['generation_agreement']:.0%} ({r['near_ties']}) | "
                     f"{r['perplexity']:.4f} | {100 * (r['perplexity'] / base - 1):+.2f}% |")
    (args.out / "lm_recipes.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
