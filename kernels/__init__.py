"""tpu_pipeline.kernels (installed from the repository folder `kernels/`).

Pallas kernels (JAX) for the hot ops of training and of GRPO's loss, with a
PyTorch bridge: plain torch tensors in and out, autograd through the Pallas
backward kernels, `torch.compile(fullgraph=True)` traces through them.

    rms_norm(x, weight, eps=1e-6, *, impl="auto")
    flash_attention(q, k, v, causal=True, sm_scale=None, *, impl="auto")
    token_logprobs(logits, labels, *, impl="auto")
    linear_token_logprobs(hidden, weight, labels, *, impl="auto")
    use_kernels(model, impl)          # a transformers Llama picks them up

JAX shares the GPU with torch: importing this package sets
XLA_PYTHON_CLIENT_PREALLOCATE=false (unless XLA_PYTHON_CLIENT_PREALLOCATE,
_MEM_FRACTION or _ALLOCATOR is already set), so JAX allocates what the kernels
need instead of 75% of the GPU up front.

impl: "torch" is the plain PyTorch reference; "pallas" forces the kernel
(interpret mode on CPU, slow: a correctness tool); "auto" runs native Pallas
when the tensors live on a TPU/GPU that JAX can drive, else torch.
"""

import os

if __name__ != "tpu_pipeline.kernels":
    # A top-level `kernels` is another PyPI distribution; this folder is only ever
    # tpu_pipeline.kernels (see pyproject's package-dir).
    raise ImportError("import tpu_pipeline.kernels, not a top-level 'kernels'")

# JAX takes 75% of a GPU's memory when its GPU backend starts, leaving torch (whose
# tensors these kernels work on) a quarter. JAX reads these variables when the backend
# starts, so setting them here, before any kernel asks JAX for a device, is in time.
# A user's own choice (any of the three variables set) is left alone.
_JAX_MEMORY_VARS = ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_ALLOCATOR")
if not any(v in os.environ for v in _JAX_MEMORY_VARS):
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"

from tpu_pipeline.kernels._api import (IMPLS, flash_attention, linear_token_logprobs, rms_norm,  # noqa: E402
                                       token_logprobs)
from tpu_pipeline.kernels._hf import sequence_logprobs, use_kernels  # noqa: E402

__all__ = [
    "IMPLS",
    "flash_attention",
    "linear_token_logprobs",
    "rms_norm",
    "sequence_logprobs",
    "token_logprobs",
    "use_kernels",
]
