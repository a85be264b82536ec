"""Every LM family through the .litertlm path: export, LiteRT-LM parity, size, speed.

For each tiny random family of tpu_pipeline.testing.lm_zoo (tests/support/lm_zoo.py) (with 1, 2 and all
key/value heads where the family has the choice), writes the float32 bundle
with litert-torch's export_hf (child process, no TensorFlow), derives the
dynamic_int8 variant, runs greedy generations through litert_lm against
transformers' generate on the zoo prompts (token for token; near-tie rule),
and measures one-thread prefill/decode tokens/s on litert_lm vs transformers
eager generate. A family the path refuses is recorded with its one-line reason.

Writes OUT/lm_families.json and OUT/lm_families.md (the table in docs/BENCHMARKS.md).

CPU command (about 25 minutes on 2 shared cores):
    nice -n 5 .venv/bin/python bench/lm_families.py --out runs/bench_lm_families
    .venv/bin/python bench/lm_families.py --cases llama:2,gemma:1 --out /tmp/lmf   # two exports
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer

from tpu_pipeline.convert.lm import litertlm
from tpu_pipeline.convert.lm.decode_ready import eos_token_ids, load_hf_causal_lm
from tpu_pipeline.convert.runtimes.measure import median_ms
from tpu_pipeline.errors import PipelineError
from tpu_pipeline.testing import lm_zoo

CACHE, PREFILL, NEW_TOKENS = 64, 16, 16
# family:kv_heads ("-": the family's own attention layout); grpo_policy: the default grpo_math
# policy's architecture (random weights), for decode speed
CASES = ("llama:1", "llama:2", "llama:4", "smollm:1", "qwen2:2", "qwen3:1", "qwen3:4", "mistral:2",
         "mistral_sliding:2", "gemma:1", "gemma2:2", "gemma3:1", "phi3:4", "gpt2:-", "grpo_policy:-")



def torch_speed(model, prompt_ids: list[int], n: int) -> dict:
    """One thread: transformers eager prefill (one forward over the prompt) and decode tokens/s
    (generate with its KV cache, minus the prefill)."""
    ids = torch.tensor([prompt_ids])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            prefill_ms = median_ms(lambda: model(ids))
            gen_ms = median_ms(lambda: model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                                      min_new_tokens=n, do_sample=False, pad_token_id=0))
    finally:
        torch.set_num_threads(threads)
    return {"prefill_tokens_per_s": len(prompt_ids) / prefill_ms * 1000,
            "decode_tokens_per_s": (n - 1) / max(1e-9, gen_ms - prefill_ms) * 1000}


def run_case(family: str, kv: str, work: Path) -> dict:
    row: dict = {"family": family, "kv_heads": kv}
    if family == "grpo_policy":
        folder = lm_zoo.save_grpo_policy_shape(work / "hf")
    else:
        folder = lm_zoo.save_family(family, work / "hf", kv_heads=None if kv == "-" else int(kv))
    model = load_hf_causal_lm(folder)
    row["params"] = sum(p.numel() for p in model.parameters())
    try:
        litertlm.check_family(model.config)
    except PipelineError as e:
        return {**row, "status": "refused", "reason": str(e)}
    t0 = time.perf_counter()
    try:
        bundle = litertlm.export_bundle(folder, work, cache_length=CACHE, prefill_length=PREFILL)
    except PipelineError as e:
        return {**row, "status": "export failed", "reason": str(e), "export_s": time.perf_counter() - t0}
    row["export_s"] = time.perf_counter() - t0
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    eos = eos_token_ids(model)
    for precision in ("float32", "dynamic_int8"):
        b = litertlm.bundle_variant(bundle, precision)
        (work / precision).mkdir()
        par = litertlm.bundle_parity(model, tok, b, list(lm_zoo.PROMPTS), max_new_tokens=NEW_TOKENS, cache_length=CACHE,
                                     eos_ids=eos, pad_id=0, work=work / precision)
        row[precision] = {"size_bytes": len(b), **{k: par[k] for k in (
            "generation_agreement", "near_ties", "agreement_with_near_ties", "first_generation_divergence",
            "logit_max_abs", "tokenizer_agreement")}}
    # Speed on the prompt the model continues longest (random weights often stop at EOS early;
    # litert_lm cannot be told to go on past it), the same token count on both sides.
    with litertlm.BundleRunner(work / "float32" / litertlm.BUNDLE_FILE, max_num_tokens=CACHE) as r:
        lengths = {p: len(r.generate_pieces(p, NEW_TOKENS)) for p in lm_zoo.PROMPTS}
        prompt = max(lm_zoo.PROMPTS, key=lambda p: lengths[p])
        prompt_ids = r.prompt_ids(prompt)
    row["litert_lm_speed"] = litertlm.latency(bundle, prompt, NEW_TOKENS, work / "speed", max_num_tokens=CACHE,
                                              threads=1)
    row["torch_speed"] = torch_speed(model, prompt_ids, max(2, lengths[prompt]))
    f32 = row["float32"]
    row["status"] = ("parity failed" if f32["generation_agreement"] < 1.0 else
                     "tokenizer differs" if f32["tokenizer_agreement"] < 1.0 else "ok")
    return row


def markdown(rows: list[dict]) -> str:
    lines = ["| family | kv heads | status | export s | float32 agreement | int8 agreement (near-ties) | "
             "float32 / int8 size KB | decode tok/s litert_lm / torch | note |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f, q = r.get("float32", {}), r.get("dynamic_int8", {})
        speed = (f"{r['litert_lm_speed']['decode_tokens_per_s']:.0f} / {r['torch_speed']['decode_tokens_per_s']:.0f}"
                 if "litert_lm_speed" in r else "")
        agree = f"{f['generation_agreement']:.0%}" if f else ""
        qa = f"{q['generation_agreement']:.0%} ({q['near_ties']})" if q else ""
        size = f"{f['size_bytes'] / 1024:.0f} / {q['size_bytes'] / 1024:.0f}" if f else ""
        export = f"{r['export_s']:.0f}" if "export_s" in r else ""
        note = r.get("reason") or (f"bundle tokenizer agrees on {f['tokenizer_agreement']:.0%} of prompts"
                                   if f and f["tokenizer_agreement"] < 1.0 else "")
        lines.append(f"| {r['family']} | {r['kv_heads']} | {r['status']} | {export} | {agree} | {qa} | {size} | "
                     f"{speed} | {note} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/bench_lm_families"))
    ap.add_argument("--cases", default=",".join(CASES), help="family:kv_heads,... (kv '-' for the family default)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in args.cases.split(","):
        family, kv = case.split(":")
        with tempfile.TemporaryDirectory(prefix=f"lmf-{family}-") as tmp:
            t0 = time.perf_counter()
            row = run_case(family, kv, Path(tmp))
            row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        print(json.dumps(row), flush=True)
        (args.out / "lm_families.json").write_text(json.dumps(rows, indent=1))
        (args.out / "lm_families.md").write_text(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
