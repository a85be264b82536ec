"""Decode-ready LiteRT export of a Hugging Face Llama-family causal LM.

The artifact has two signatures over one set of weights, with the KV cache
as explicit inputs and outputs (the shape LiteRT-LM style runtimes drive):

    prefill(tokens[1, P] int32, input_pos[P] int32, k_cache, v_cache) -> logits[1, P, V], k_cache, v_cache
    decode (tokens[1, 1] int32, input_pos[1] int32, k_cache, v_cache) -> logits[1, 1, V], k_cache, v_cache

k_cache / v_cache: [layers, 1, kv_heads, max_len, head_dim] float32. The
cache update is a one-hot blend rather than a scatter so every op is a plain
TFLite builtin; a prompt shorter than P is right-padded, and the padded
positions are masked until decode overwrites them. Sliding-window layers
(Mistral, Qwen2's use_sliding_window) mask the slots older than the window,
as transformers does; the cache itself keeps every position.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import torch
from torch import nn

from tpu_pipeline.errors import UserError
from tpu_pipeline.files import atomic_write_json

LLAMA_FAMILY = ("llama", "mistral", "qwen2")


@dataclasses.dataclass(frozen=True)
class LMShape:
    layers: int
    kv_heads: int
    heads: int
    head_dim: int
    vocab: int
    max_len: int
    prefill_len: int
    windows: tuple[int | None, ...] = ()  # per layer: sliding window (keys within the last w positions) or None

    def cache_shape(self) -> tuple[int, ...]:
        return (self.layers, 1, self.kv_heads, self.max_len, self.head_dim)


def lm_shape(config, max_len: int, prefill_len: int) -> LMShape:
    if getattr(config, "model_type", None) not in LLAMA_FAMILY:
        raise UserError(f"decode-ready export supports {', '.join(LLAMA_FAMILY)} models, "
                        f"not model_type {getattr(config, 'model_type', None)!r}")
    if not 0 < prefill_len <= max_len:
        raise UserError(f"need 0 < prefill length ({prefill_len}) <= cache length ({max_len})")
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return LMShape(config.num_hidden_layers, config.num_key_value_heads or heads, heads, head_dim,
                   config.vocab_size, max_len, prefill_len, sliding_windows(config))


def sliding_windows(config) -> tuple[int | None, ...]:
    """Each layer's sliding window as transformers applies it: Mistral's sliding_window on every
    layer; Qwen2's on the layers its layer_types mark sliding_attention (use_sliding_window);
    None: full causal attention."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None) or ["sliding_attention"] * config.num_hidden_layers
    return tuple(window if window and kind == "sliding_attention" else None for kind in types)


class KVCacheLM(nn.Module):
    """Functional-cache forward over the weights of an HF Llama-family model."""

    def __init__(self, hf_model: nn.Module, shape: LMShape):
        super().__init__()
        self.lm = hf_model.eval()
        self.shape = shape

    def forward(self, tokens, input_pos, k_cache, v_cache):
        s, core = self.shape, self.lm.model
        pos = input_pos.long()
        x = core.embed_tokens(tokens.long())
        cos, sin = core.rotary_emb(x, pos[None, :])
        slots = torch.arange(s.max_len, device=pos.device)
        write = (slots[None, :] == pos[:, None]).to(x.dtype)                  # [T, max_len]
        keep = 1.0 - write.amax(dim=0)                                        # [max_len]
        visible = slots[None, :] <= pos[:, None]                              # [T, max_len]
        biases = {w: _bias(visible & (slots[None, :] > pos[:, None] - w) if w else visible, x.dtype)
                  for w in set(s.windows) | {None}}
        new_k, new_v = [], []
        for i, layer in enumerate(core.layers):
            att = layer.self_attn
            h = layer.input_layernorm(x)
            b, t, _ = h.shape
            q = att.q_proj(h).view(b, t, s.heads, s.head_dim).transpose(1, 2)
            k = att.k_proj(h).view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
            v = att.v_proj(h).view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            # cache[l] = cache[l] * keep + one_hot(write) @ new
            kc = k_cache[i] * keep[None, None, :, None] + torch.einsum("tm,bhtd->bhmd", write, k)
            vc = v_cache[i] * keep[None, None, :, None] + torch.einsum("tm,bhtd->bhmd", write, v)
            new_k.append(kc)
            new_v.append(vc)
            o = _grouped_attention(q, kc, vc, biases[s.windows[i] if s.windows else None], s.kv_heads)
            x = x + att.o_proj(o.transpose(1, 2).reshape(b, t, s.heads * s.head_dim))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        logits = self.lm.lm_head(core.norm(x))
        return logits, torch.stack(new_k), torch.stack(new_v)


def _bias(visible, dtype):
    """Additive attention bias [1, 1, T, max_len]: 0 where a query sees a key slot, else the lowest float."""
    return torch.where(visible, 0.0, torch.finfo(dtype).min)[None, None]


def _grouped_attention(q, k, v, bias, kv_heads: int):
    """softmax(q k^T / sqrt(d) + bias) v with each key/value head shared by its group of query heads
    (HF's repeat_kv: query head j reads kv head j // group), without repeating the cache.

    The query heads of a group are folded into rows ([b, kv, group*t, d] @ [b, kv, d, max_len]), so
    no kv head is ever broadcast. Repeating it (repeat_interleave or expand) is exact in PyTorch
    but, with one kv head, litert-torch 0.10 lowers `repeat(k)[1,1,M,D] -> [1,H,M,D]` followed by
    the transpose for q @ k^T into RESHAPE [1,1,M,D] -> [1,1,D,M] + BROADCAST_TO: a reshape where
    a transpose belongs, i.e. wrong scores (docs/DESIGN.md, measured facts).
    """
    b, heads, t, d = q.shape
    group = heads // kv_heads
    scores = q.reshape(b, kv_heads, group * t, d) @ k.transpose(-1, -2) * (d ** -0.5)
    scores = scores.reshape(b, kv_heads, group, t, -1) + bias[:, :, None]
    p = torch.softmax(scores, dim=-1).reshape(b, kv_heads, group * t, -1)
    return (p @ v).reshape(b, heads, t, d)


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


INPUT_NAMES = ("tokens", "input_pos", "k_cache", "v_cache")
OUTPUT_NAMES = ("logits", "k_cache", "v_cache")


class _Named(nn.Module):
    """Keyword inputs and a dict output give the signatures readable tensor names."""

    def __init__(self, inner: KVCacheLM):
        super().__init__()
        self.inner = inner

    def forward(self, tokens, input_pos, k_cache, v_cache):
        return dict(zip(OUTPUT_NAMES, self.inner(tokens, input_pos, k_cache, v_cache)))


def sample_inputs(shape: LMShape, length: int) -> dict[str, torch.Tensor]:
    cache = torch.zeros(shape.cache_shape())
    return dict(zip(INPUT_NAMES, (torch.zeros(1, length, dtype=torch.int32),
                                  torch.arange(length, dtype=torch.int32), cache, cache.clone())))


def export_decode_ready(hf_model: nn.Module, path: str | Path, *, max_len: int, prefill_len: int) -> LMShape:
    """Writes one .tflite with `prefill` and `decode` signatures; returns the cache shape."""
    import litert_torch  # heavy: pulls in the TFLite converter stack; only exports need it

    shape = lm_shape(hf_model.config, max_len, prefill_len)
    module = _Named(KVCacheLM(hf_model.float(), shape)).eval()
    converter = litert_torch.signature("prefill", module, sample_kwargs=sample_inputs(shape, prefill_len))
    converter = converter.signature("decode", module, sample_kwargs=sample_inputs(shape, 1))
    converter.convert().export(str(path))
    return shape


@torch.no_grad()
def greedy_reference(hf_model: nn.Module, prompt_ids: list[int], max_new_tokens: int, eos_ids: set[int],
                     max_len: int) -> list[int]:
    """PyTorch's greedy continuation, with the artifact's stopping rules."""
    ids = list(prompt_ids)
    new: list[int] = []
    while len(new) < max_new_tokens:
        logits = hf_model(torch.tensor([ids])).logits[0, -1]
        token = int(torch.argmax(logits))
        new.append(token)
        ids.append(token)
        if token in eos_ids or len(ids) > max_len:
            break
    return new


def generation_parity(hf_model: nn.Module, runtime, prompts: list[list[int]], max_new_tokens: int) -> dict:
    """Token-for-token agreement of greedy generations, plus each prompt's
    last prefill logits from both sides (`ref_logits`, `got_logits`) for the
    usual elementwise metrics and PyTorch's generations (`ref_ids`)."""
    agree, first = 0, None
    ref_logits, got_logits, ref_ids = [], [], []
    for i, prompt in enumerate(prompts):
        ref = greedy_reference(hf_model, prompt, max_new_tokens, runtime.eos_ids, runtime.max_len)
        ref_ids.append(ref)
        got = runtime.generate_ids(prompt, max_new_tokens)
        if ref == got:
            agree += 1
        elif first is None:
            at = next((j for j, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
            first = {"prompt": i, "token_index": at, "torch": ref[at:at + 4], "litert": got[at:at + 4]}
        with torch.no_grad():
            ref_logits.append(hf_model(torch.tensor([prompt])).logits[0, -1:].numpy())
        got_logits.append(runtime.last_prefill_logits(prompt)[None])
    return {"prompts": len(prompts), "generation_agreement": agree / max(1, len(prompts)),
            "first_generation_divergence": first, "ref_logits": ref_logits, "got_logits": got_logits,
            "ref_ids": ref_ids}


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def load_hf_causal_lm(folder: str | Path) -> nn.Module:
    """Weights from safetensors only; no code from the folder is ever run."""
    from transformers import AutoModelForCausalLM  # heavy: seconds to import; only HF folders need it

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise UserError(f"{folder}: not a Hugging Face model folder (config.json missing)")
    if not any(folder.glob("*.safetensors")):
        raise UserError(f"{folder}: no *.safetensors weights (pickled .bin weights are refused)")
    try:
        return AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=False, use_safetensors=True,
                                                    dtype=torch.float32).eval()
    except (OSError, ValueError, KeyError) as e:
        raise UserError(f"{folder}: cannot load as a causal LM ({str(e).splitlines()[0]})") from None


def eos_token_ids(hf_model: nn.Module) -> list[int]:
    ids = getattr(getattr(hf_model, "generation_config", None), "eos_token_id", None)
    if ids is None:
        ids = hf_model.config.eos_token_id
    return sorted({ids} if isinstance(ids, int) else set(ids or []))


def cache_lengths(config, max_len: int | None = None, prefill_len: int | None = None) -> tuple[int, int]:
    """(KV-cache length, tokens per prefill call): the given ones, else min(max_position_embeddings, 256)
    and min(32, cache length)."""
    max_len = max_len or min(int(getattr(config, "max_position_embeddings", 256)), 256)
    return max_len, prefill_len or min(32, max_len)


def write_decode_ready(hf_dir: str | Path, out_dir: str | Path, *, max_len: int | None = None,
                       prefill_len: int | None = None, model: nn.Module | None = None) -> dict:
    """hf_dir -> out_dir/{model.tflite, lm.json, tokenizer files}; returns lm.json's content.
    `model`: hf_dir's model when the caller has loaded it already."""
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    if not (hf_dir / "tokenizer.json").is_file():
        raise UserError(f"{hf_dir}: tokenizer.json missing; the artifact ships the tokenizer for its clients")
    model = model if model is not None else load_hf_causal_lm(hf_dir)
    max_len, prefill_len = cache_lengths(model.config, max_len, prefill_len)
    out_dir.mkdir(parents=True, exist_ok=True)
    shape = export_decode_ready(model, out_dir / "model.tflite", max_len=max_len, prefill_len=prefill_len)
    for name in TOKENIZER_FILES:
        if (hf_dir / name).is_file():
            shutil.copy(hf_dir / name, out_dir / name)
    meta = {
        "format": "tpu-pipeline/decode-ready-lm@1",
        "signatures": {"prefill": {"inputs": list(INPUT_NAMES), "outputs": list(OUTPUT_NAMES),
                                   "tokens_shape": [1, prefill_len]},
                       "decode": {"inputs": list(INPUT_NAMES), "outputs": list(OUTPUT_NAMES),
                                  "tokens_shape": [1, 1]}},
        "max_len": max_len, "prefill_len": prefill_len, "cache_shape": list(shape.cache_shape()),
        "cache_dtype": "float32", "vocab_size": shape.vocab, "eos_token_ids": eos_token_ids(model),
        "model_type": model.config.model_type, "source": str(hf_dir),
    }
    atomic_write_json(out_dir / "lm.json", meta)
    return meta
