"""What changes when the local engine runs on an accelerator instead of the CPU:
the compute precision (bf16 autocast over fp32 master weights), where the
sampling RNG lives (on the device, next to the logits it samples from), and how
an update is split into micro-batches whose gradients add up to the whole
batch's.

Nothing here asks what hardware exists: the engine is handed a torch device by
`tpu_pipeline.select_device` and these functions follow it.
"""

from __future__ import annotations

import contextlib

import torch

# Devices where precision "auto" means bf16 autocast: it halves activation memory and
# runs the tensor cores. Not CPU (bf16 matmuls are emulated there, slower than fp32);
# not yet TPU (torch-tpu's autocast is untested here: set precision = "bfloat16").
BF16_DEVICES = ("cuda",)


def device_type(device) -> str:
    return getattr(device, "type", None) or torch.device(str(device)).type


def compute_dtype(precision: str, device) -> torch.dtype:
    """`trainer.precision` on `device`: auto = bf16 on CUDA, fp32 elsewhere."""
    if precision == "bfloat16" or (precision == "auto" and device_type(device) in BF16_DEVICES):
        return torch.bfloat16
    return torch.float32


def autocast(precision: str, device):
    """The context the engine runs forward passes in: autocast to bf16 where the
    precision asks for it (weights, optimizer state and the log-softmax stay fp32),
    nothing otherwise."""
    dtype = compute_dtype(precision, device)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type(device), dtype=dtype)


def sampling_generator(device, seed: int) -> torch.Generator:
    """A generator on the device the logits live on: torch.multinomial refuses a CPU
    generator for CUDA probabilities, and sampling on the device avoids copying the
    (B, V) probabilities to the host every token."""
    dt = device_type(device)
    gen = torch.Generator(device=dt) if dt == "cuda" else torch.Generator()
    return gen.manual_seed(seed)


def micro_batches(rows: torch.Tensor, size: int, group: int = 1) -> list[torch.Tensor]:
    """`rows` split into chunks of at most `size` rows (0 = one chunk), rounded to whole
    groups of `group` rows so a chunk never splits a GRPO group."""
    if size <= 0 or size >= len(rows):
        return [rows]
    size = max(group, size - size % group)
    return [rows[s:s + size] for s in range(0, len(rows), size)]


def chunk_weight(mask: torch.Tensor, total_mask: torch.Tensor, loss_agg_mode: str) -> float:
    """The weight of a micro-batch's loss so the chunks' gradients sum to the whole
    minibatch's under VeRL's aggregation: its share of the tokens for token-mean, of
    the (non-empty) sequences for the seq-mean modes."""
    if loss_agg_mode == "token-mean":
        return float(mask.sum() / total_mask.sum().clamp(min=1))
    rows = (mask.sum(-1) > 0).sum()
    return float(rows / (total_mask.sum(-1) > 0).sum().clamp(min=1))
