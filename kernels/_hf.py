"""Make a transformers causal LM use these kernels.

`use_kernels(model, impl)` swaps every RMSNorm module's forward for `rms_norm`
and registers an attention function with transformers' AttentionInterface that
calls `flash_attention`, plus a mask builder for it. The kernel knows causal
masking aligned bottom-right and left padding (per row, the first key in use),
so unpadded batches, left-padded batches (prompts for generation), right-padded
ones (causal attention never lets a real token see the padding after it) and
their KV-cache decode steps all run the kernel. Anything else falls back to
torch's scaled_dot_product_attention with transformers' own 4D mask: padding
with holes, a static cache (keys not aligned to the end), sliding-window or
packed-sequence masks, attention dropout. Under torch.compile the hole check is
skipped (it is data-dependent): padding must then be left and/or right only,
which is what tokenizers and the GRPO batches produce.
"""

from __future__ import annotations

import types

import torch

from tpu_pipeline.errors import UserError
from tpu_pipeline.kernels._api import _check_impl, flash_attention, linear_token_logprobs, rms_norm
from tpu_pipeline.registry import Registry

ATTN_NAME = "tpu_pipeline"
_IMPL_ATTR = "_tpu_pipeline_kernels"


def _rmsnorm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    eps = getattr(self, "variance_epsilon", getattr(self, "eps", 1e-6))
    return rms_norm(hidden_states, self.weight, eps, impl=getattr(self, _IMPL_ATTR))


def _attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                       scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """AttentionInterface function: [B, H, S, D] in, ([B, S, H, D], None) out, like sdpa's."""
    impl = getattr(module, _IMPL_ATTR, "auto")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    kv_start = None
    if attention_mask is not None and attention_mask.dim() == 1:
        kv_start, attention_mask = attention_mask, None  # from _kernel_mask: left padding per row
    if attention_mask is not None or dropout > 0.0:
        # heavy: transformers (seconds to import) loads only once a transformers model is routed here
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        if kv_start is not None:  # dropout: torch runs it, so the padding becomes a mask again
            attention_mask = _mask_from_start(kv_start, query.shape[2], key.shape[2], causal)

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    out = flash_attention(query, key, value, causal=causal, sm_scale=scaling, kv_start=kv_start, impl=impl)
    return out.transpose(1, 2).contiguous(), None


def _mask_from_start(kv_start: torch.Tensor, sq: int, sk: int, causal: bool) -> torch.Tensor:
    """Boolean [B, 1, Sq, Sk] mask equal to what the kernel applies (True = attend)."""
    i = torch.arange(sq, device=kv_start.device)[:, None]
    j = torch.arange(sk, device=kv_start.device)[None, :]
    keep = (j <= i + (sk - sq)) if causal else torch.ones(sq, sk, dtype=torch.bool, device=kv_start.device)
    return keep[None, None] & (j >= kv_start.view(-1, 1, 1, 1))


def _kernel_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                 attention_mask=None, local_size=None, **kwargs):
    """Mask builder registered next to the attention function.

    Returns None (no padding), an int32 [B] tensor of first keys in use (left/right
    padding only: the kernel's case), or sdpa's 4D boolean mask (anything else: the
    attention function then falls back to torch). Without a registered builder
    transformers would pass no mask at all and silently ignore padding.
    """
    # heavy: transformers, as above
    from transformers.masking_utils import causal_mask_function, prepare_padding_mask, sdpa_mask

    def fallback():
        return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                         kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                         local_size=local_size, **{**kwargs, "allow_is_causal_skip": False})

    # The kernel's causal mask assumes the queries are the last q_length keys. Tensor
    # offsets come from static caches (keys not aligned to the end): torch's case.
    if isinstance(q_offset, torch.Tensor) or isinstance(kv_offset, torch.Tensor):
        return fallback()
    aligned = q_offset + q_length == kv_offset + kv_length
    if mask_function is not causal_mask_function or local_size is not None or not aligned:
        return fallback()
    padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
    if padding is None:
        return None
    padding = padding[:, kv_offset: kv_offset + kv_length].bool()
    j = torch.arange(kv_length, device=padding.device)
    has = padding.any(-1)
    start = torch.where(has, padding.int().argmax(-1), kv_length)
    if not torch.compiler.is_compiling():
        end = torch.where(has, kv_length - padding.flip(-1).int().argmax(-1), 0)
        if not torch.equal(padding, (j >= start[:, None]) & (j < end[:, None])):
            return fallback()  # holes in the padding
    return start.to(torch.int32)


def _register() -> None:
    # heavy: transformers, as above; only a model being routed needs it
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_NAME, _attention_forward)
    AttentionMaskInterface.register(ATTN_NAME, _kernel_mask)


# transformers model_types whose RMSNorm is x * rsqrt(mean(x^2) + eps) * weight and whose
# attention is plain scaled dot-product (no logit soft-capping, no attention sinks). Gemma's
# norm scales by (1 + weight), for one, so a name-based swap would be silently wrong: a family
# is added only once tests/kernels/test_models_on_cpu.py matches it against transformers.
KERNEL_FAMILIES: Registry[str] = Registry(
    "kernel model family", "a KERNEL_FAMILIES.add line in kernels/_hf.py, and a case in tests/kernels/test_models_on_cpu.py")
KERNEL_FAMILIES.add("llama", "llama", "Llama: RMSNorm, grouped-query attention")
KERNEL_FAMILIES.add("mistral", "mistral", "Mistral: as Llama; with a sliding window (its config's default) attention falls back to torch")
KERNEL_FAMILIES.add("qwen2", "qwen2", "Qwen2: as Llama, with q/k/v biases (the kernel never sees them)")
KERNEL_FAMILIES.add("qwen3", "qwen3", "Qwen3: as Llama, with RMSNorm on q and k (swapped too)")


def use_kernels(model: torch.nn.Module, impl: str = "auto") -> torch.nn.Module:
    """Route a transformers model's RMSNorm and attention through these kernels (in place).

    Returns the model. Counts of swapped modules are in `model._tpu_pipeline_kernels_info`.
    """
    _check_impl(impl)
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in KERNEL_FAMILIES:
        raise UserError(f"use_kernels: {type(model).__name__} (model_type {model_type!r}) is not supported; "
                        f"supported transformers families: {', '.join(KERNEL_FAMILIES.names())}")
    norms = [m for m in model.modules()
             if type(m).__name__.endswith("RMSNorm") and isinstance(getattr(m, "weight", None), torch.Tensor)]
    attns = [m for m in model.modules() if hasattr(m, "num_key_value_groups") and hasattr(m, "scaling")]
    if not attns:
        raise UserError(f"use_kernels: {type(model).__name__} has no transformers attention modules to route")
    _register()
    for mod in norms:
        setattr(mod, _IMPL_ATTR, impl)
        mod.forward = types.MethodType(_rmsnorm_forward, mod)
    for mod in attns:
        setattr(mod, _IMPL_ATTR, impl)
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(ATTN_NAME)
    else:
        config._attn_implementation = ATTN_NAME
    model._tpu_pipeline_kernels_info = {"impl": impl, "rms_norm": len(norms), "attention": len(attns)}
    return model


def sequence_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                      *, impl: str = "auto") -> torch.Tensor:
    """Log-probabilities of input_ids[:, 1:] under a causal LM: [B, S] -> [B, S-1] float32.

    Runs the model body for hidden states and fuses the LM head into
    linear_token_logprobs, so the [B, S, V] logits never exist at once. Positions
    whose next token is padding (attention_mask 0) give 0.
    """
    body = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    hidden = body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise UserError("sequence_logprobs: an LM head with a bias is not supported")
    labels = input_ids[:, 1:]
    if attention_mask is not None:
        labels = labels.masked_fill(attention_mask[:, 1:] == 0, -100)
    return linear_token_logprobs(hidden[:, :-1], head.weight, labels, impl=impl)
