"""LoRA for large policies (peft): rollout and update run through the adapted
model, the optimizer sees only the adapter weights, and the adapters are merged
into plain weights for `policy/` (so `tpu-pipeline convert policy/` and
`AutoModelForCausalLM` load it without peft).

    tpu-pipeline rl --recipe grpo_gsm8k --policy DIR --lora-rank 16

The engine is handed the *inner* transformers model (peft's LoRA layers are
injected in place), so every code path that runs a plain model (KV-cache
sampling, the fused log-prob kernel through `model.model`/`model.lm_head`,
`use_kernels`) runs it unchanged. The KL reference is the same model with its
adapters switched off, not a second copy of the weights.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from tpu_pipeline.errors import UserError


@dataclass
class Lora:
    """The peft wrapper of an adapted policy; `model` is what the engine trains."""
    peft_model: object

    @property
    def model(self):
        return self.peft_model.get_base_model()

    def trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    @contextlib.contextmanager
    def adapters_off(self):
        with self.peft_model.disable_adapter():
            yield

    def merged(self):
        """The base model with the adapters folded into its weights (peft's merge_and_unload):
        a plain transformers model, no peft layers left. Ends this wrapper's use."""
        return self.peft_model.merge_and_unload()


def add_lora(model, *, rank: int, alpha: float = 0.0, target_modules: str = "all-linear", seed: int = 0) -> Lora:
    """Injects LoRA adapters into `model` (in place) and freezes everything else.

    lora_A's random init is drawn from `seed` (a forked RNG), so a run is reproducible
    from its recipe and seed like a full-weight run."""
    # heavy: peft imports accelerate and bitsandbytes hooks (seconds); only LoRA runs need it
    from peft import LoraConfig, get_peft_model

    if rank < 1:
        raise UserError(f"policy.lora_rank must be >= 1 for LoRA, got {rank}")
    targets = target_modules if target_modules == "all-linear" else [
        t.strip() for t in target_modules.split(",") if t.strip()]
    cfg = LoraConfig(r=rank, lora_alpha=alpha or 2 * rank, lora_dropout=0.0, target_modules=targets,
                     bias="none", task_type="CAUSAL_LM")
    try:
        dev = next(model.parameters()).device
        with torch.random.fork_rng(devices=[dev.index or 0] if dev.type == "cuda" else []):
            torch.manual_seed(seed)
            peft_model = get_peft_model(model, cfg)
    except ValueError as e:  # peft: no module matched target_modules
        raise UserError(f"policy.lora_target_modules {target_modules!r}: {str(e).splitlines()[0]}") from None
    return Lora(peft_model)


class AdaptersOff:
    """The KL reference of a LoRA policy: the policy with its adapters disabled, i.e. the
    frozen starting weights, without a second copy of them in memory.

    Called like the model (the engine only calls its reference under no_grad); `.model`
    and `.lm_head` mirror the transformers layout so the fused log-prob kernel path
    (rollout.token_logprobs) runs on it too."""

    def __init__(self, lora: Lora, module=None):
        self._lora = lora
        self._module = module

    def __call__(self, *args, **kwargs):
        module = self._module if self._module is not None else self._lora.model
        with torch.no_grad(), self._lora.adapters_off():
            return module(*args, **kwargs)

    @property
    def model(self) -> "AdaptersOff":
        return AdaptersOff(self._lora, self._lora.model.model)

    @property
    def lm_head(self):
        # An adapted lm_head's `.weight` is its base layer's (peft), i.e. the frozen weight.
        return self._lora.model.lm_head
