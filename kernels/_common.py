"""Shared pieces of the Pallas kernels (JAX side)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

try:
    from jax.experimental.pallas import triton as plgpu
except ImportError:  # a JAX without Pallas's Triton backend: GPU launch parameters are dropped
    plgpu = None

# Masked scores use a large finite negative, not -inf: exp(-inf - -inf) is NaN
# when a whole block is masked.
NEG = -1e30


def acc_dtype(dtype) -> jnp.dtype:
    return jnp.float64 if jnp.dtype(dtype) == jnp.float64 else jnp.float32


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def pad_axis(x: jax.Array, axis: int, size: int, value=0) -> jax.Array:
    if x.shape[axis] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths, constant_values=value)


def dot_nt(a: jax.Array, b: jax.Array, out) -> jax.Array:
    """a [m, k] . b [n, k]^T -> [m, n], accumulating in `out` dtype."""
    return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=out, precision=_prec(a))


def dot_nn(a: jax.Array, b: jax.Array, out) -> jax.Array:
    """a [m, k] . b [k, n] -> [m, n]."""
    return lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=out, precision=_prec(a))


def dot_tn(a: jax.Array, b: jax.Array, out) -> jax.Array:
    """a [k, m]^T . b [k, n] -> [m, n]."""
    return lax.dot_general(a, b, (((0,), (0,)), ((), ())), preferred_element_type=out, precision=_prec(a))


def _prec(a):
    # float32 inputs keep full precision (no TF32 / bf16 passes); bf16 needs none.
    return lax.Precision.HIGHEST if a.dtype in (jnp.float32, jnp.float64) else None


def lowering(cfg, interpret: bool) -> str:
    """What a kernel call lowers for: "interpret" (Pallas's interpreter, any machine),
    "gpu" (Pallas -> Triton) or "tpu" (Pallas -> Mosaic).

    The chip is the one the blocks were sized for (`cfg.target`, from _blocks' Device),
    never the JAX backend of this process: torch-tpu's jax_op exports the kernel for
    platforms=["tpu"] from a process whose JAX runs on CPU, and the lowering tests
    export for TPU and CUDA on a machine with neither.
    """
    return "interpret" if interpret else cfg.target


def call(kernel, *, grid, in_specs, out_specs, out_shape, target: str, name: str,
         launch: tuple[int, int] | None = None, input_output_aliases: dict[int, int] | None = None):
    """pl.pallas_call with list-valued specs and shapes (every kernel here has several
    outputs), with the compiler parameters of `target` (see `lowering`):
      - "gpu": Triton's launch parameters, launch = (num_warps, num_stages). Passing
        them is also what makes Pallas lower through Triton: without them JAX picks
        Mosaic GPU, which cannot lower these kernels (shared memory, copy sizes);
      - "tpu": every grid axis "parallel" (no grid step reads what another wrote), so
        Mosaic may split the grid over the TensorCores of a megacore chip (v4, v5p);
      - "interpret": none."""
    params = None
    if target == "gpu" and launch is not None and plgpu is not None:
        params = plgpu.CompilerParams(num_warps=launch[0], num_stages=launch[1])
    elif target == "tpu":
        params = pltpu.CompilerParams(dimension_semantics=("parallel",) * len(grid))
    return pl.pallas_call(kernel, grid=grid, in_specs=list(in_specs), out_specs=list(out_specs),
                          out_shape=list(out_shape), interpret=target == "interpret", name=name,
                          compiler_params=params, input_output_aliases=dict(input_output_aliases or {}))


def kernel_jit(*, static_argnames):
    """jax.jit that compiles interpret-mode calls with XLA's optimiser off.

    Interpret mode is a correctness tool: its compile time, not its run time,
    dominates (about half with optimisation level 0). Native calls compile as usual.
    """
    fast = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}

    def wrap(fn):
        native = jax.jit(fn, static_argnames=static_argnames)
        interp = jax.jit(fn, static_argnames=static_argnames, compiler_options=fast)

        @functools.wraps(fn)
        def run(*args, interpret: bool, **kw):
            return (interp if interpret else native)(*args, interpret=interpret, **kw)

        run.native, run.interpreted = native, interp
        return run

    return wrap


def row_scalars_spec(n: int, target: str):
    """BlockSpec for an int32 [B, n] array of run-time scalars (lengths): each program
    of batch row b (grid axis 0) reads row b. On TPU scalars live in SMEM, whole."""
    if target == "tpu":
        return pl.BlockSpec(memory_space=pltpu.SMEM)
    return pl.BlockSpec((None, n), lambda b, *_: (b, 0))


def read_row_scalar(ref, i: int, target: str):
    """Scalar i of this program's row of a row_scalars_spec array."""
    return ref[pl.program_id(0), i] if target == "tpu" else ref[i]


def feature_dim(n: int, target: str) -> int:
    """Size a feature (lane) dimension is padded to: Pallas on GPU lowers through
    Triton, whose blocks must be powers of two; elsewhere the true size (a TPU block
    may span a whole dimension of any size). Zero padding leaves dot products and
    sums of squares unchanged."""
    if target != "gpu":
        return n
    return max(16, pl.next_power_of_2(n))
