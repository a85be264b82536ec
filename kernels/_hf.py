"""Make a transformers causal LM use these kernels.

`use_kernels(model, impl)` swaps every RMSNorm module's forward for `rms_norm`
and registers an attention function with transformers' AttentionInterface that
calls `flash_attention`. Where transformers hands the attention a mask (padded
batches, chunked prefill against a cache) the function falls back to torch's
scaled_dot_product_attention with that mask: the kernel takes no arbitrary
mask. Without padding, training and KV-cache decoding (causal aligned
bottom-right) both run the kernel.
"""

from __future__ import annotations

import types

import torch

from ..errors import UserError
from ._api import _check_impl, flash_attention, linear_token_logprobs, rms_norm

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
    if attention_mask is not None or dropout > 0.0:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    out = flash_attention(query, key, value, causal=causal, sm_scale=scaling, impl=impl)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_NAME, _attention_forward)
    # sdpa's mask builder returns None when no token is padded, which is when the
    # kernel can run; without a registered builder transformers would pass no mask
    # at all and silently drop padding.
    AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)


def use_kernels(model: torch.nn.Module, impl: str = "auto") -> torch.nn.Module:
    """Route a transformers model's RMSNorm and attention through these kernels (in place).

    Returns the model. Counts of swapped modules are in `model._tpu_pipeline_kernels_info`.
    """
    _check_impl(impl)
    norms = 0
    attns = 0
    for mod in model.modules():
        if type(mod).__name__.endswith("RMSNorm") and isinstance(getattr(mod, "weight", None), torch.Tensor):
            setattr(mod, _IMPL_ATTR, impl)
            mod.forward = types.MethodType(_rmsnorm_forward, mod)
            norms += 1
        elif hasattr(mod, "num_key_value_groups") and hasattr(mod, "scaling"):
            setattr(mod, _IMPL_ATTR, impl)
            attns += 1
    config = getattr(model, "config", None)
    if config is None or not attns:
        raise UserError(f"use_kernels: {type(model).__name__} has no transformers attention modules to route")
    _register()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(ATTN_NAME)
    else:
        config._attn_implementation = ATTN_NAME
    model._tpu_pipeline_kernels_info = {"impl": impl, "rms_norm": norms, "attention": attns}
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
