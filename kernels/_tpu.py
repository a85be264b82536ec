"""TorchTPU route: tensors on device "tpu" reach the Pallas kernels through
`torch.tpu.pallas.jax_op`, torch-tpu's public way to call a JAX function on its tensors.

torch-tpu 0.2.0's `jax_op("namespace::name", fn)` registers `fn` as a torch custom op:
it reads fn's signature (every parameter not bound by functools.partial must be
annotated jax.Array or a plain type, and the return annotated), exports fn with
`jax.export(..., platforms=["tpu"])` and runs the exported module on the chip. So the
kernels lower here for the TPU (Mosaic, TPU blocks), whatever JAX's own backend in this
process is. One op is registered per kernel and static configuration (torch refuses a
name twice), and kept.

Checked against the real torch-tpu 0.2.0 without a TPU (tests/core/
test_tpu_contract_on_cpu.py, in .venv-tpu): each op registers and infers its output
shapes on meta tensors, which exports the kernel for the TPU. Never run on a TPU.
"""

from __future__ import annotations

import functools
import itertools

import torch

from tpu_pipeline.errors import UserError

# Tests that stand in a fake jax_op running the JAX function on CPU set this, so the
# kernel runs in Pallas's interpreter there; the real jax_op lowers for the chip.
INTERPRET = False

_names = itertools.count()


def jax_op():
    pallas = getattr(getattr(torch, "tpu", None), "pallas", None)
    op = getattr(pallas, "jax_op", None)
    if op is None:
        raise UserError("tensors are on a TPU but torch.tpu.pallas.jax_op is missing (torch-tpu older than 0.2.0?)")
    return op


@functools.lru_cache(maxsize=None)
def op_for(fn, static: tuple, interpret: bool):
    """The torch custom op that runs kernel `fn` with its static arguments bound."""
    bound = functools.partial(fn, interpret=interpret, **dict(static))
    return jax_op()(f"tpu_pipeline_tpu::{fn.__name__}_{next(_names)}", bound)


def run(fn, tensors, static: dict):
    out = op_for(fn, tuple(sorted(static.items())), INTERPRET)(*tensors)
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)
