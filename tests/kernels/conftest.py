"""Test helpers for the Pallas kernels.

`poisoned_call` replaces the kernels' `pl.pallas_call` wrapper so that every
output starts as NaN (-1 for integers): a block a kernel never writes then fails
the comparison instead of passing as stale zeros. It lives here, not in the
library: only tests need it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from tpu_pipeline.kernels import _attention, _logprobs, _rmsnorm

KERNEL_MODULES = (_attention, _logprobs, _rmsnorm)


def poisoned_call(kernel, *, grid, in_specs, out_specs, out_shape, target: str, name: str, launch=None,
                  input_output_aliases=None):
    """Same signature as tpu_pipeline.kernels._common.call; aliases a NaN-filled input
    onto each output the kernel does not already initialise from an input, so what
    the kernel does not write stays NaN."""
    outs = list(out_shape)
    n_in = len(in_specs)
    aliases = dict(input_output_aliases or {})
    fill_outs = [i for i in range(len(outs)) if i not in aliases.values()]

    def kernel_ignoring_fills(*refs):
        kernel(*refs[:n_in], *refs[n_in + len(fill_outs):])

    aliases.update({n_in + j: i for j, i in enumerate(fill_outs)})
    raw = pl.pallas_call(kernel_ignoring_fills, grid=grid, in_specs=list(in_specs) + [out_specs[i] for i in fill_outs],
                         out_specs=list(out_specs), out_shape=outs, interpret=target == "interpret", name=name,
                         input_output_aliases=aliases)

    def run(*args):
        fills = [jnp.full(outs[i].shape, jnp.nan if jnp.issubdtype(outs[i].dtype, jnp.floating) else -1,
                          outs[i].dtype) for i in fill_outs]
        return raw(*args, *fills)

    return run


@pytest.fixture
def poisoning_call():
    """The poisoning wrapper itself (test files cannot import conftest under importlib mode)."""
    return poisoned_call


@pytest.fixture(scope="module")
def poisoned_kernels():
    """Every kernel called in the module poisons its outputs first.

    JAX caches traces per function and static arguments, and `call` is looked up at
    trace time: caches are cleared on the way in and out, so neither a clean trace
    leaks into this module nor a poisoned one out of it.
    """
    with pytest.MonkeyPatch.context() as mp:
        for mod in KERNEL_MODULES:
            mp.setattr(mod, "call", poisoned_call)
        jax.clear_caches()
        yield
    jax.clear_caches()
