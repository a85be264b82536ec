"""The engine's accelerator plumbing, checked on CPU: which precision and sampling
RNG a device gets (CUDA faked where torch's CPU build cannot make the real thing),
bf16 autocast really running the policy's matmuls in bf16 over fp32 weights, and
micro-batches whose accumulated gradients equal the whole batch's."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

from tpu_pipeline.rl import accel

from .conftest import SMALL


def test_precision_follows_the_device():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert accel.compute_dtype("auto", cpu) == torch.float32
    assert accel.compute_dtype("auto", cuda) == torch.bfloat16
    assert accel.compute_dtype("float32", cuda) == torch.float32
    assert accel.compute_dtype("bfloat16", cpu) == torch.bfloat16
    assert isinstance(accel.autocast("auto", cpu), contextlib.nullcontext)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CPU-only torch warns that CUDA autocast is unavailable
        ctx = accel.autocast("auto", cuda)
    assert isinstance(ctx, torch.autocast) and ctx.device == "cuda" and ctx.fast_dtype == torch.bfloat16


def test_sampling_generator_lives_on_the_device(monkeypatch):
    made = []

    class FakeGenerator:
        def __init__(self, device="cpu"):
            made.append(str(device))

        def manual_seed(self, seed):
            self.seed = seed
            return self

    monkeypatch.setattr(torch, "Generator", FakeGenerator)
    g = accel.sampling_generator(torch.device("cuda", 0), 7)
    assert made == ["cuda"] and g.seed == 7
    accel.sampling_generator(torch.device("cpu"), 1)
    assert made == ["cuda", "cpu"]


def test_micro_batches_keep_groups_whole():
    rows = torch.arange(16)
    assert [c.tolist() for c in accel.micro_batches(rows, 0)] == [list(range(16))]
    assert [len(c) for c in accel.micro_batches(rows, 6, group=4)] == [4, 4, 4, 4]
    assert [len(c) for c in accel.micro_batches(rows, 9, group=4)] == [8, 8]
    assert [len(c) for c in accel.micro_batches(rows, 3, group=4)] == [4, 4, 4, 4]
    assert [len(c) for c in accel.micro_batches(rows, 5)] == [5, 5, 5, 1]


def _engine(tiny_policy, tmp_path, overrides, optimizer="sgd"):
    from tpu_pipeline.rl.recipe import load_recipe
    from tpu_pipeline.rl.data import build_source
    from tpu_pipeline.rl.engine import Engine
    from tpu_pipeline.rl.policy import build_optimizer, load_policy
    from tpu_pipeline.rl.rewards import GuardedReward, load_reward

    cfg = load_recipe("grpo_math", {**SMALL, "optim.lr": 0.5, "optim.warmup_steps": 0, "optim.grad_clip": 1e9,
                                    "trainer.track_kl": False, **overrides})
    model, tok = load_policy(tiny_policy)
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr)
    else:
        opt, _ = build_optimizer(model, lr=cfg.optim.lr, weight_decay=0.0, carry_from=None)
    return Engine(cfg=cfg, model=model, tokenizer=tok, optimizer=opt, source=build_source(cfg.data, 0),
                  reward=GuardedReward(load_reward("rewards_for_tests:starts_with_hash"), 5.0), out=tmp_path,
                  device=torch.device("cpu"))


def _delta(tiny_policy, tmp_path, overrides):
    eng = _engine(tiny_policy, tmp_path, overrides)
    before = {k: v.clone() for k, v in eng.model.state_dict().items()}
    row = eng.train_step()
    assert "skipped" not in row, row
    return {k: v - before[k] for k, v in eng.model.state_dict().items()}, row


@pytest.mark.parametrize("extra", [
    {},                                                   # grouped log-probs, one update
    {"algorithm.loss_agg_mode": "seq-mean-token-mean"},
    {"trainer.minibatches": 2},                           # per-row log-probs, two shuffled updates
])
def test_micro_batched_update_equals_the_whole_batch(tmp_path, tiny_policy, test_rewards, extra):
    whole, r0 = _delta(tiny_policy, tmp_path / "a", {**extra, "trainer.micro_batch_size": 0})
    micro, r1 = _delta(tiny_policy, tmp_path / "b", {**extra, "trainer.micro_batch_size": 5})
    assert r0["reward"] == r1["reward"] and r0["groups_kept"] == r1["groups_kept"]
    assert max(float(d.abs().max()) for d in whole.values()) > 1e-4  # the step moved the weights
    for k in whole:
        torch.testing.assert_close(micro[k], whole[k], atol=1e-6, rtol=1e-4)


def test_bf16_precision_runs_matmuls_in_bf16_over_fp32_weights(tmp_path, tiny_policy, test_rewards):
    eng = _engine(tiny_policy, tmp_path, {"trainer.precision": "bfloat16"}, optimizer="adamw")
    seen: set = set()
    hooks = [m.register_forward_hook(lambda mod, inp, out: seen.add(out.dtype))
             for n, m in eng.model.named_modules() if n.endswith("q_proj")]
    rows = []
    for _ in range(2):
        rows.append(eng.train_step())
        eng.step += 1
    for h in hooks:
        h.remove()
    assert seen == {torch.bfloat16}
    assert any("skipped" not in r for r in rows) and all(r.get("nan", 0) == 0 for r in rows)
    assert all(p.dtype == torch.float32 for p in eng.model.parameters())
    states = [s for s in eng.optimizer.state.values() if "exp_avg" in s]
    assert states and all(s["exp_avg"].dtype == torch.float32 for s in states)
    # Evaluation takes the same precision: it stays a finite accuracy.
    acc = eng.evaluate(eng.source.heldout()[:8])["accuracy"]
    assert 0.0 <= acc <= 1.0


@pytest.mark.parametrize("kind,expected", [("cuda", ["auto"]), ("cpu", [])])
def test_an_accelerator_platform_turns_our_kernels_on(tmp_path, tiny_policy, monkeypatch, kind, expected):
    import tpu_pipeline
    from tpu_pipeline.device import Platform
    from tpu_pipeline.rl import api

    calls = []
    fake = Platform(kind=kind, device=torch.device("cpu"), count=1, name=f"fake {kind}", bf16=kind == "cuda",
                    compile_backend="inductor", kernel_lowering="gpu" if kind == "cuda" else "interpret",
                    reason="test")
    monkeypatch.setattr(tpu_pipeline, "select_device", lambda want: fake)
    monkeypatch.setattr(api, "use_kernels", lambda model, impl: calls.append(impl) or model)
    res = api.run("grpo_math", tmp_path / "r", policy=str(tiny_policy), steps=1, kernels="auto",
                  overrides={**SMALL, "trainer.kernels": "auto", "trainer.eval_k": 0}, progress=False,
                  log=lambda m: None)
    assert calls == expected and res["steps"] == 1


def test_fused_logprobs_take_autocasts_dtype(tiny_policy):
    from tpu_pipeline.rl.policy import load_policy
    from tpu_pipeline.rl.rollout import token_logprobs

    model, tok = load_policy(tiny_policy)
    enc = tok(["1+2=#### 3", "7-3+1=#### 5"], padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    plain = token_logprobs(model, ids, mask, 6, 1.0, "torch")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = token_logprobs(model, ids, mask, 6, 1.0, "pallas")
        plain_bf16 = token_logprobs(model, ids, mask, 6, 1.0, "torch")
    assert fused.dtype == torch.float32 and fused.shape == plain.shape
    # bf16 operands: close to the bf16 torch path, and within bf16 rounding of fp32.
    torch.testing.assert_close(fused, plain_bf16, atol=0.05, rtol=0.02)
    assert 0 < float((fused - plain).abs().max()) < 0.1
