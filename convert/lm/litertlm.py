"""LiteRT-LM bundles (`model.litertlm`) for Hugging Face causal LMs, and their
parity on the runtime apps use (`litert_lm`, package litert-lm-api).

A bundle holds one .tflite with LiteRT-LM's signatures (`prefill_<P>` and
`decode`: tokens, input_pos, an additive attention mask and per-layer
kv_cache_k_i / kv_cache_v_i state tensors), the LLM metadata (start/stop/pad
tokens, max_num_tokens, sampler defaults, prompt template), the executor
metadata describing those state tensors, and the HF tokenizer. An app loads
it with LiteRT-LM's Engine and needs no code from us.

The bundle is written by litert-torch's `export_hf` (in a child process,
_litertlm_worker.py, without TensorFlow; docs/DESIGN.md has the decision and
its evidence). It is exported once in float32; a target's variant quantizes
the bundle's .tflite with ai-edge-quantizer and repacks it with
litert-lm-builder, the rest of the bundle unchanged.

Parity: greedy generations through `litert_lm` vs transformers' `generate`,
token for token, on the same prompt text. A divergence where the reference's
top-2 logit gap is below the variant's measured logit error (the bundle's
own .tflite run teacher-forced on ai-edge-litert against PyTorch's logits) is
a near-tie, not a failure.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
import litert_lm_builder
import numpy as np
from google.protobuf import text_format
from litert_lm_builder.runtime.proto import llm_metadata_pb2, sampler_params_pb2
import torch
from ai_edge_litert.interpreter import Interpreter
from tokenizers import Tokenizer

from tpu_pipeline.convert.lm.litertlm_runtime import BUNDLE_FILE, RUNTIME, BundleRunner
from tpu_pipeline.convert.lm.quant_recipes import quantize_lm
from tpu_pipeline.errors import ConversionError, UserError
from tpu_pipeline.registry import Registry

__all__ = ["BUNDLE_FILE", "LM_FAMILIES", "RUNTIME", "BundleRunner", "LMFamily", "bundle_parity", "bundle_tflite",
           "bundle_variant", "check_family", "decode_logits", "export_bundle", "latency", "repack", "sampler_defaults",
           "verdict"]
EXPORT_TIMEOUT_S = 900


@dataclasses.dataclass(frozen=True)
class LMFamily:
    """A Hugging Face model_type the .litertlm path was measured on (bench/lm_families.py, docs/BENCHMARKS.md)."""

    refused: str = ""  # why it is refused, one line ("": supported)


# Every model_type export_hf + litert_lm were verified on here, supported or refused; anything else
# is refused in one line before export starts.
LM_FAMILIES: Registry[LMFamily] = Registry(
    "LM family", "a tiny config in tpu_pipeline.testing.lm_zoo and a case in tests/convert/test_lm_families_on_cpu.py; "
                 "once it passes, one LM_FAMILIES.add in convert/lm/litertlm.py (refused=: the one-line reason)")
LM_FAMILIES.add("llama", LMFamily(), "Llama (grouped-query, multi-query and full attention; tied embeddings as in SmolLM)")
LM_FAMILIES.add("qwen2", LMFamily(), "Qwen2")
LM_FAMILIES.add("qwen3", LMFamily(), "Qwen3 (q/k norms)")
LM_FAMILIES.add("mistral", LMFamily(), "Mistral (with or without sliding_window)")
LM_FAMILIES.add("gemma", LMFamily(), "Gemma (scaled embeddings, 1+w norm)")
LM_FAMILIES.add("gemma2", LMFamily(), "Gemma 2 (logit soft-capping, alternating sliding-window layers)")
LM_FAMILIES.add("gemma3_text", LMFamily(), "Gemma 3 text (q/k norms, alternating sliding-window layers)")
LM_FAMILIES.add("phi3", LMFamily(), "Phi-3")
LM_FAMILIES.add("gpt2", LMFamily(refused="GPT-2 is not supported: litert-torch 0.10's export_hf fails on it (GPT2Config "
                                         "has no num_key_value_heads)"), "GPT-2 (refused)")


def check_family(config) -> None:
    """UserError (one line) for a model family or feature the bundle path does not support."""
    model_type = getattr(config, "model_type", None)
    if model_type in LM_FAMILIES and LM_FAMILIES.get(model_type).refused:
        raise UserError(f".litertlm bundles: {LM_FAMILIES.get(model_type).refused}")
    if model_type not in LM_FAMILIES:
        supported = [e.name for e in LM_FAMILIES.entries() if not e.obj.refused]
        raise UserError(f".litertlm bundles are built for model types {', '.join(supported)}, not {model_type!r}")


def export_bundle(hf_dir: Path, work: Path, *, cache_length: int, prefill_length: int) -> bytes:
    """The float32 bundle for the HF folder; ConversionError with export_hf's last line if it fails.
    Its log goes to work/litertlm_export.log."""
    out = work / "litertlm_float"
    log = work / "litertlm_export.log"
    worker = Path(__file__).with_name("_litertlm_worker.py")
    with open(log, "w") as f:
        try:
            rc = subprocess.run([sys.executable, str(worker), str(hf_dir), str(out), str(cache_length),
                                 str(prefill_length)], stdout=f, stderr=subprocess.STDOUT,
                                timeout=EXPORT_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            raise ConversionError(f"litert-torch export_hf took over {EXPORT_TIMEOUT_S} s (log: {log})") from None
    bundle = out / BUNDLE_FILE
    if rc != 0 or not bundle.is_file():
        raise ConversionError(f"litert-torch export_hf could not write a .litertlm: {_last_error(log)} (log: {log})")
    return bundle.read_bytes()


def _last_error(log: Path) -> str:
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln.split(":")[0] or ln.startswith("AssertionError")]
    return (errors or lines or ["no output"])[-1][:300]


def _unpacked(bundle: bytes, work: Path) -> tuple[Path, Path]:
    """Unpacks the bundle into `work`; returns (model.toml, the prefill/decode .tflite)."""
    (work / "in.litertlm").write_bytes(bundle)
    toml_path = Path(litert_lm_builder.unpack(str(work / "in.litertlm"), str(work / "unpacked")))
    sections = tomllib.loads(toml_path.read_text())["section"]
    models = [s for s in sections if s.get("section_type") == "TFLiteModel"]
    if len(models) != 1:
        raise ConversionError(f".litertlm with {len(models)} TFLite sections; expected one prefill/decode model")
    return toml_path, toml_path.parent / models[0]["data_path"]


def sampler_defaults(bundle: bytes) -> dict | None:
    """The sampler defaults in the bundle's LLM metadata ({"type", "top_k", "top_p", "temperature",
    "seed"}), or None when it has none (LiteRT-LM then uses its engine's own)."""
    with tempfile.TemporaryDirectory(prefix="tpu-pipeline-litertlm-") as tmp:
        toml_path, _ = _unpacked(bundle, Path(tmp))
        sections = tomllib.loads(toml_path.read_text())["section"]
        meta = next((s for s in sections if s.get("section_type") == "LlmMetadata"), None)
        if meta is None:
            return None
        path = toml_path.parent / meta["data_path"]
        proto = llm_metadata_pb2.LlmMetadata()
        if path.suffix == ".pbtext":
            text_format.Parse(path.read_text(), proto)
        else:
            proto.ParseFromString(path.read_bytes())
    if not proto.HasField("sampler_params"):
        return None
    p = proto.sampler_params
    return {"type": sampler_params_pb2.SamplerParameters.Type.Name(p.type), "top_k": p.k,
            "top_p": round(p.p, 6), "temperature": round(p.temperature, 6), "seed": p.seed}


def bundle_tflite(bundle: bytes) -> bytes:
    """The bundle's prefill/decode .tflite."""
    with tempfile.TemporaryDirectory(prefix="tpu-pipeline-litertlm-") as tmp:
        return _unpacked(bundle, Path(tmp))[1].read_bytes()


def bundle_variant(bundle: bytes, precision: str) -> bytes:
    """The bundle with its .tflite quantized to `precision` (an LM recipe, quant_recipes.py; float32
    is the bundle itself). Metadata and tokenizer are unchanged."""
    if precision == "float32":
        return bundle
    if precision == "static_int8":
        raise ConversionError("static int8 of a KV-cache LM needs calibration, which is not built; "
                              "use a float or dynamic int8 profile")
    return repack(bundle, quantize_lm(bundle_tflite(bundle), precision, signature="decode"))


def repack(bundle: bytes, tflite: bytes) -> bytes:
    """The bundle with its prefill/decode .tflite replaced by `tflite` (litert-lm-builder);
    metadata and tokenizer unchanged."""
    with tempfile.TemporaryDirectory(prefix="tpu-pipeline-litertlm-") as tmp:
        toml_path, path = _unpacked(bundle, Path(tmp))
        path.write_bytes(tflite)
        out = Path(tmp) / "out.litertlm"
        litert_lm_builder.pack(str(toml_path), str(out))
        return out.read_bytes()


@dataclasses.dataclass(frozen=True)
class Reference:
    """transformers' greedy generation for one prompt."""

    prompt_ids: list[int]
    ids: list[int]            # generated, up to and including a stop token
    top2_gaps: list[float]    # per generated token: top-1 minus top-2 logit


def greedy_reference(model: torch.nn.Module, prompt_ids: list[int], max_new_tokens: int, eos_ids: list[int],
                     pad_id: int) -> Reference:
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=eos_ids or None, pad_token_id=pad_id,
                             output_logits=True, return_dict_in_generate=True)
    gen = out.sequences[0, len(prompt_ids):].tolist()
    gaps = []
    for step in out.logits[:len(gen)]:
        top = torch.topk(step[0].float(), 2).values
        gaps.append(float(top[0] - top[1]))
    return Reference(prompt_ids, gen, gaps)


def decode_logits(tflite: bytes, sequences: list[list[int]]) -> list[np.ndarray] | None:
    """Logits [len(seq), vocab] of the bundle's .tflite for each sequence, fed one token at a time
    through its `decode` signature (teacher-forced) on ai-edge-litert. None when the signature has
    inputs beyond tokens/input_pos/mask/kv caches (e.g. a separate sliding-window mask)."""
    interp = Interpreter(model_content=tflite, num_threads=1)
    runner = interp.get_signature_runner("decode")
    details = runner.get_input_details()
    state_names = [n for n in details if n.startswith("kv_cache_")]
    if set(details) - set(state_names) != {"tokens", "input_pos", "mask"}:
        return None
    mask_shape = details["mask"]["shape"]
    result = []
    for seq in sequences:
        state = {n: np.zeros(details[n]["shape"], details[n]["dtype"]) for n in state_names}
        rows = []
        for pos, token in enumerate(seq[:mask_shape[-1]]):
            mask = np.full(mask_shape, -np.inf, np.float32)
            mask[..., :pos + 1] = 0.0
            out = runner(tokens=np.array([[token]], np.int32), input_pos=np.array([pos], np.int32), mask=mask, **state)
            state = {n: out[n] for n in state_names}
            rows.append(out["logits"].reshape(-1))
        result.append(np.stack(rows))
    return result


def decode_logit_error(tflite: bytes, model: torch.nn.Module, sequences: list[list[int]]) -> float | None:
    """Max |logit - PyTorch logit| of the bundle's .tflite over `sequences`, teacher-forced
    (decode_logits). None when the signature cannot be driven that way."""
    got = decode_logits(tflite, sequences)
    if got is None:
        return None
    worst = 0.0
    for seq, logits in zip(sequences, got):
        with torch.no_grad():
            ref = model(torch.tensor([seq[:len(logits)]])).logits[0].float().numpy()
        worst = max(worst, float(np.abs(logits - ref).max()))
    return worst


def _compare(tokenizer: Tokenizer, ref: Reference, pieces: list[str], eos_ids: list[int],
             logit_error: float | None) -> dict:
    """Token-for-token verdict for one prompt: the reference's tokens, decoded one prefix at a time,
    must spell the engine's output exactly (the engine prints special tokens as text and hides
    the stop token)."""
    got = "".join(pieces)
    body = ref.ids[:-1] if ref.ids and ref.ids[-1] in eos_ids else ref.ids
    ref_text = tokenizer.decode(body, skip_special_tokens=False)
    if got == ref_text:
        return {"match": True}
    index = 0
    while index < len(body) and got.startswith(tokenizer.decode(body[:index + 1], skip_special_tokens=False)):
        index += 1
    done = tokenizer.decode(body[:index], skip_special_tokens=False)
    rest = got[len(done):]
    litert = tokenizer.encode(rest, add_special_tokens=False).ids[:1] if rest else []
    gap = ref.top2_gaps[index] if index < len(ref.top2_gaps) else None
    near_tie = gap is not None and logit_error is not None and gap < logit_error
    return {"match": False, "token_index": index,
            "torch": ref.ids[index] if index < len(ref.ids) else None,
            "litert": litert[0] if litert else None, "litert_text": rest[:16],
            "top2_gap": gap, "near_tie": near_tie}


def bundle_parity(model: torch.nn.Module, tokenizer: Tokenizer, bundle: bytes, texts: list[str], *,
                  max_new_tokens: int, cache_length: int, eos_ids: list[int], pad_id: int, work: Path,
                  threads: int | None = None) -> dict:
    """Greedy generations of `bundle` through litert_lm vs transformers on each prompt text.

    Returns report figures: generation_agreement (exact matches / prompts), near_ties,
    agreement_with_near_ties, first_generation_divergence, logit_max_abs (the bundle's .tflite,
    teacher-forced), tokenizer_agreement (the bundle's tokenizer vs the folder's on the prompts)."""
    path = work / BUNDLE_FILE
    path.write_bytes(bundle)
    refs, verdicts, tokenizer_ok = [], [], 0
    with BundleRunner(path, max_num_tokens=cache_length, threads=threads) as runner:
        for text in texts:
            ids = runner.prompt_ids(text)
            hf_ids = tokenizer.encode(text, add_special_tokens=False).ids
            tokenizer_ok += ids[len(ids) - len(hf_ids):] == hf_ids
            ref = greedy_reference(model, ids, max_new_tokens, eos_ids, pad_id)
            refs.append(ref)
            verdicts.append(runner.generate_pieces(text, max_new_tokens))
    diverged = [i for i, (ref, pieces) in enumerate(zip(refs, verdicts))
                if "".join(pieces) != tokenizer.decode(ref.ids[:-1] if ref.ids and ref.ids[-1] in eos_ids
                                                       else ref.ids, skip_special_tokens=False)]
    logit_error = decode_logit_error(bundle_tflite(bundle), model,
                                     [refs[i].prompt_ids + refs[i].ids for i in diverged]) if diverged else None
    results = [_compare(tokenizer, ref, pieces, eos_ids, logit_error) for ref, pieces in zip(refs, verdicts)]
    n = max(1, len(texts))
    exact = sum(r["match"] for r in results)
    near = sum(r.get("near_tie", False) for r in results)
    first = next(({"prompt": i, **{k: v for k, v in r.items() if k != "match"}}
                  for i, r in enumerate(results) if not r["match"]), None)
    return {"runtime": RUNTIME, "prompts": len(texts), "generation_agreement": exact / n, "near_ties": near,
            "agreement_with_near_ties": (exact + near) / n, "first_generation_divergence": first,
            "logit_max_abs": logit_error, "tokenizer_agreement": tokenizer_ok / n,
            "max_new_tokens": max_new_tokens}


def verdict(figures: dict, min_agreement: float) -> list[str]:
    """Reasons the bundle fails (empty: passed). Near-ties count as agreement; any other
    divergence, or a tokenizer that disagrees with the folder's, fails."""
    reasons = []
    if figures["agreement_with_near_ties"] < min_agreement:
        d = figures["first_generation_divergence"] or {}
        gap = d.get("top2_gap")
        reasons.append(f"litert_lm: greedy generations agree on {figures['generation_agreement']:.0%} of prompts "
                       f"({figures['near_ties']} near-ties; need {min_agreement:.0%}); first divergence: prompt "
                       f"{d.get('prompt')}, token {d.get('token_index')} (torch {d.get('torch')}, litert "
                       f"{d.get('litert')}; top-2 gap {gap if gap is None else round(gap, 4)}, logit error "
                       f"{figures['logit_max_abs'] if figures['logit_max_abs'] is None else round(figures['logit_max_abs'], 4)})")
    if figures["tokenizer_agreement"] < 1.0:
        reasons.append(f"litert_lm: the bundle's tokenizer encodes {1 - figures['tokenizer_agreement']:.0%} of the "
                       f"prompts differently from the folder's tokenizer.json")
    return reasons


def latency(bundle: bytes, text: str, max_new_tokens: int, work: Path, *, max_num_tokens: int,
            threads: int) -> dict:
    """One prompt's greedy generation on litert_lm: median ms per generated token (prefill
    included, as the reference client is timed) and the engine's own prefill/decode tokens/s."""
    work.mkdir(parents=True, exist_ok=True)
    path = work / BUNDLE_FILE
    path.write_bytes(bundle)
    with BundleRunner(path, max_num_tokens=max_num_tokens, threads=threads, benchmark=True) as runner:
        n = max(1, len(runner.generate_pieces(text, max_new_tokens)))
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            runner.generate(text, max_new_tokens)
            runs.append((time.perf_counter() - t0) * 1000 / n)
        speed = runner.benchmark(text, max_new_tokens)
    return {"ms_per_token": float(np.median(runs)), "tokens": n, "threads": threads, **speed}
