"""Native Pallas on a CUDA GPU (skipped elsewhere): the kernels against the torch path.

Needs jax[cuda12] beside torch. Not run on this project's CI machine (no GPU).
"""

from __future__ import annotations

import pytest
import torch

from tpu_pipeline.kernels import flash_attention, linear_token_logprobs, rms_norm, token_logprobs

pytestmark = pytest.mark.gpu


def _close(a, b, tol):
    assert (a.double() - b.double()).abs().max() <= tol * b.double().abs().max()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_kernels_match_torch_on_gpu(dtype, tol):
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(300, 256, device=dev, dtype=dtype, generator=g)
    w = torch.randn(256, device=dev, dtype=dtype, generator=g)
    _close(rms_norm(x, w, impl="pallas"), rms_norm(x, w, impl="torch"), tol)
    q = torch.randn(2, 8, 200, 64, device=dev, dtype=dtype, generator=g)
    k = torch.randn(2, 2, 200, 64, device=dev, dtype=dtype, generator=g)
    _close(flash_attention(q, k, k, impl="pallas"), flash_attention(q, k, k, impl="torch"), tol)
    logits = torch.randn(100, 5000, device=dev, dtype=dtype, generator=g)
    labels = torch.randint(0, 5000, (100,), device=dev, generator=g)
    _close(token_logprobs(logits, labels, impl="pallas"), token_logprobs(logits, labels, impl="torch"), tol)
    h = torch.randn(100, 256, device=dev, dtype=dtype, generator=g)
    W = torch.randn(5000, 256, device=dev, dtype=dtype, generator=g) * 0.05
    _close(linear_token_logprobs(h, W, labels, impl="pallas"), linear_token_logprobs(h, W, labels, impl="torch"), tol)
