"""The PyTorch bridge: implementation choice, bad input, torch.compile, the TorchTPU route."""

from __future__ import annotations

import types

import pytest
import torch

from tpu_pipeline.errors import UserError
from tpu_pipeline.kernels import _bridge, _reference as ref, _tpu
from tpu_pipeline.kernels import flash_attention, linear_token_logprobs, rms_norm, token_logprobs


class Block(torch.nn.Module):
    """A miniature decoder step: RMSNorm -> causal attention -> fused LM head log-probs."""

    def __init__(self, dim=16, heads=2, kv_heads=1, vocab=50, impl="pallas"):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.impl, self.heads, self.kv_heads, self.hd = impl, heads, kv_heads, dim // heads
        self.norm = torch.nn.Parameter(1 + 0.1 * torch.randn(dim, generator=g))
        self.q = torch.nn.Parameter(torch.randn(dim, dim, generator=g) * dim ** -0.5)
        self.kv = torch.nn.Parameter(torch.randn(2 * kv_heads * self.hd, dim, generator=g) * dim ** -0.5)
        self.head = torch.nn.Parameter(torch.randn(vocab, dim, generator=g) * dim ** -0.5)

    def forward(self, x, labels):
        B, S, D = x.shape
        h = rms_norm(x, self.norm, impl=self.impl, block_rows=8)
        q = (h @ self.q.t()).view(B, S, self.heads, self.hd).transpose(1, 2)
        k, v = (h @ self.kv.t()).view(B, S, 2, self.kv_heads, self.hd).permute(2, 0, 3, 1, 4)
        a = flash_attention(q, k, v, impl=self.impl, block_q=8, block_k=8).transpose(1, 2).reshape(B, S, D)
        return linear_token_logprobs(x + a, self.head, labels, impl=self.impl, block_rows=8, block_vocab=128)


def test_torch_compile_fullgraph_traces_through_the_kernels():
    x = torch.randn(2, 11, 16)
    labels = torch.randint(0, 50, (2, 11))
    eager, compiled_model = Block(), Block()
    want = eager(x, labels)
    want.sum().backward()
    torch._dynamo.reset()
    compiled = torch.compile(compiled_model, fullgraph=True, backend="aot_eager")
    got = compiled(x, labels)
    got.sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(compiled_model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5, msg=name)
    # And the same module with the torch references agrees with the kernels.
    torch.testing.assert_close(Block(impl="torch")(x, labels), want, rtol=1e-5, atol=1e-5)


def test_auto_picks_torch_on_cpu_and_pallas_is_forced(monkeypatch):
    calls = []
    monkeypatch.setattr(_bridge, "rms_norm", lambda *a: calls.append(a) or ref.rms_norm(*a[:3]))
    x, w = torch.randn(4, 8), torch.randn(8)
    rms_norm(x, w, impl="auto")
    rms_norm(x, w, impl="torch")
    assert calls == []
    rms_norm(x, w, impl="pallas")
    assert len(calls) == 1


def test_auto_picks_native_pallas_only_where_jax_can_drive_the_device(monkeypatch):
    from tpu_pipeline.kernels import _api

    monkeypatch.setattr(_api, "_jax_platforms", lambda: frozenset({"gpu"}))
    assert _api._native_pallas("cuda") and _api._native_pallas("tpu") and not _api._native_pallas("cpu")
    monkeypatch.setattr(_api, "_jax_platforms", lambda: frozenset({"cpu"}))  # torch has CUDA, JAX does not
    with pytest.warns(UserWarning, match="JAX sees no GPU"):
        assert not _api._native_pallas("cuda")


@pytest.mark.parametrize("call,match", [
    (lambda: rms_norm(torch.randn(4, 8), torch.randn(7)), "weight shape"),
    (lambda: rms_norm(torch.randn(4, 8), torch.randn(8), impl="cuda"), "valid: auto, pallas, torch"),
    (lambda: flash_attention(torch.randn(1, 3, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)), "multiple"),
    (lambda: flash_attention(torch.randn(3, 4, 8), torch.randn(3, 4, 8), torch.randn(3, 4, 8)), "batch, heads"),
    (lambda: token_logprobs(torch.randn(2, 5, 10), torch.zeros(2, 4, dtype=torch.long)), "must match"),
    (lambda: token_logprobs(torch.randn(2, 10), torch.zeros(2)), "integer"),
    (lambda: linear_token_logprobs(torch.randn(2, 6), torch.randn(10, 5), torch.zeros(2, dtype=torch.long)), "do not fit"),
])
def test_bad_input_is_one_clear_user_error(call, match):
    with pytest.raises(UserError, match=match):
        call()


def _fake_torch_tpu(monkeypatch):
    """A stand-in for torch-tpu's `torch.tpu.pallas.jax_op(name, fn)` that runs what the
    real one cannot run here: it hands the tensors to the JAX function through DLPack,
    with the kernel interpreted (JAX on CPU). Its name and signature checks are the real
    package's, checked in tests/core/test_tpu_contract_on_cpu.py."""
    import jax

    seen = []

    def jax_op(name, fn):
        assert name.startswith("tpu_pipeline_tpu::") and name.count("::") == 1, name

        def call(*tensors):
            seen.append(name)
            out = fn(*(jax.dlpack.from_dlpack(t) for t in tensors))
            out = out if isinstance(out, (tuple, list)) else (out,)
            return tuple(torch.from_dlpack(o) for o in out)

        return call

    monkeypatch.setattr(torch, "tpu", types.SimpleNamespace(pallas=types.SimpleNamespace(jax_op=jax_op)), raising=False)
    monkeypatch.setattr(_tpu, "INTERPRET", True)
    _tpu.op_for.cache_clear()  # ops made with another test's jax_op
    return seen


def test_tpu_route_goes_through_jax_op(monkeypatch):
    seen = _fake_torch_tpu(monkeypatch)
    # Tensors "on a TPU": the bridge must route every kernel through jax_op.
    monkeypatch.setattr(_bridge, "_device_type", lambda t: "tpu")
    x = torch.randn(3, 5, 16, requires_grad=True)
    w = torch.randn(16, requires_grad=True)
    y = rms_norm(x, w, impl="pallas", block_rows=8)
    y.sum().backward()
    assert [n.split("::")[1].rsplit("_", 1)[0] for n in seen] == ["rms_norm_fwd", "rms_norm_bwd"]
    _tpu.op_for.cache_clear()
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    yr = ref.rms_norm(xr, wr)
    yr.sum().backward()
    torch.testing.assert_close(y, yr, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad, wr.grad, rtol=1e-5, atol=1e-5)


def test_tpu_route_without_jax_op_says_so(monkeypatch):
    monkeypatch.setattr(torch, "tpu", types.SimpleNamespace(), raising=False)
    with pytest.raises(UserError, match="jax_op is missing"):
        _tpu.jax_op()


def test_dlpack_crossing_is_zero_copy():
    import jax

    t = torch.randn(64, 32)
    assert jax.dlpack.from_dlpack(t).unsafe_buffer_pointer() == t.data_ptr()


def test_bench_script_runs_on_cpu_and_says_interpret_mode(tmp_path):
    import json
    import pathlib
    import subprocess
    import sys

    # Run as a user runs it: a script, not a module loaded by its path.
    script = pathlib.Path(__file__).parents[2] / "bench" / "kernels.py"
    out = tmp_path / "k.json"
    run = subprocess.run([sys.executable, str(script), "--device", "cpu", "--only", "rms", "--warmup", "0",
                          "--iters", "1", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "INTERPRET mode" in run.stdout
    result = json.loads(out.read_text())
    assert result["ceilings"]["bandwidth_gbs"] > 0
    row = result["kernels"][0]
    assert row["kernel"] == "rms_norm" and row["fwd+bwd"]["pallas_ms"] > 0
    assert row["memory"]["pallas"]["peak_mib"] is None  # no peak-memory counter on CPU: n/a, not 0
    # The blocks the device configuration chose (CPU runs the H200's) are in the results.
    assert any(b.startswith("rms_norm_fwd: RowBlocks(rows=32, d=256") for b in row["blocks"]), row["blocks"]
    bogus = subprocess.run([sys.executable, str(script), "--device", "cpu", "--only", "rms,bogus"],
                           capture_output=True, text=True, timeout=600)
    assert bogus.returncode == 2


def test_gpu_feature_padding_is_exact(monkeypatch):
    """On GPU, feature dims are zero-padded to powers of two (Triton's block rule). Forced
    on here, in interpret mode: outputs and gradients must not change. (The fused LM
    head pads H to whole slices of its hidden block instead: H=6 -> 16 below.)"""
    from tpu_pipeline.kernels import _attention, _rmsnorm

    for mod in (_rmsnorm, _attention):
        monkeypatch.setattr(mod, "feature_dim", lambda n, target: max(16, 1 << (n - 1).bit_length()))
    g = torch.Generator().manual_seed(0)
    d = dict(dtype=torch.float64)
    cases = [
        (lambda x, w: rms_norm(x, w, impl="pallas", block_rows=8), lambda x, w: ref.rms_norm(x, w),
         (torch.randn(5, 7, 12, generator=g, **d), torch.randn(12, generator=g, **d))),
        (lambda q, k: flash_attention(q, k, k, impl="pallas", block_q=8, block_k=8),
         lambda q, k: ref.flash_attention(q, k, k),
         (torch.randn(1, 2, 5, 6, generator=g, **d), torch.randn(1, 1, 7, 6, generator=g, **d))),
        (lambda h, w: linear_token_logprobs(h, w, torch.tensor([[1, 5, 39]]), impl="pallas"),
         lambda h, w: ref.linear_token_logprobs(h, w, torch.tensor([[1, 5, 39]])),
         (torch.randn(1, 3, 6, generator=g, **d), torch.randn(40, 6, generator=g, **d))),
    ]
    for kernel, reference, inputs in cases:
        a = [t.clone().requires_grad_() for t in inputs]
        b = [t.clone().requires_grad_() for t in inputs]
        out, want = kernel(*a), reference(*b)
        torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
        cot = torch.randn(out.shape, generator=g, **d)
        for ga, gb in zip(torch.autograd.grad(out, a, cot), torch.autograd.grad(want, b, cot)):
            torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("preset,want", [
    ({}, "false"),
    ({"XLA_PYTHON_CLIENT_MEM_FRACTION": ".5"}, "None"),  # the user's own setting stays theirs
])
def test_importing_the_kernels_turns_off_jax_gpu_preallocation(preset, want):
    """JAX would take 75% of the GPU from torch at its first GPU call; the kernels package
    sets XLA_PYTHON_CLIENT_PREALLOCATE=false before anything in it imports JAX."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_PYTHON_CLIENT_")}
    env.update(preset)
    code = ("import os, sys; import tpu_pipeline.kernels; "
            "print(os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE'), 'jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [want, "False"]
