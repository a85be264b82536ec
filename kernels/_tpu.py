"""TorchTPU route: tensors on device "tpu" reach the Pallas kernels through
`torch.tpu.pallas.jax_op`, which hands torch's device buffers to a JAX function.

Written against torch-tpu's documented entry point; unit-tested with a fake
`torch.tpu.pallas` module only. Not verified on TPU hardware.
"""

from __future__ import annotations

import functools

import jax
import torch

from tpu_pipeline.errors import UserError


def jax_op():
    pallas = getattr(getattr(torch, "tpu", None), "pallas", None)
    op = getattr(pallas, "jax_op", None)
    if op is None:
        raise UserError("tensors are on a TPU but torch.tpu.pallas.jax_op is missing (torch-tpu too old?)")
    return op


def run(fn, tensors, static: dict):
    # JAX compiles the kernel for the chip when it drives a TPU; where it has no
    # accelerator (the fake in tests) the same kernel runs interpreted.
    interpret = jax.default_backend() == "cpu"
    bound = functools.partial(fn, interpret=interpret, **static)
    out = jax_op()(bound)(*tensors)
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)
