"""The local engine on a CUDA GPU (skipped elsewhere; bench/rl_gpu_check.sh runs it):
grpo_gsm8k with bf16 autocast, use_kernels and the fused log-prob kernel, KV-cache
sampling on the GPU, and LoRA. Not yet run on a GPU by this project (see
docs/BENCHMARKS.md)."""

from __future__ import annotations

import json

import pytest
import torch

from .chat_models import save_chat_policy

pytestmark = pytest.mark.gpu

GSM_SMALL = {
    "data.heldout_n": 8, "data.max_prompt_length": 1024, "data.max_response_length": 16,
    "trainer.prompts_per_step": 4, "rollout.n": 4, "trainer.eval_k": 2, "trainer.eval_every": 0,
    "trainer.save_every": 0, "trainer.micro_batch_size": 8, "optim.lr": 1e-3, "optim.warmup_steps": 1,
}


@pytest.fixture(scope="module")
def chat_policy(tmp_path_factory):
    return save_chat_policy(tmp_path_factory.mktemp("chat") / "policy")


@pytest.mark.parametrize("kernels", ["auto", "torch"])
def test_grpo_gsm8k_on_cuda_in_bf16(tmp_path, chat_policy, test_rewards, kernels):
    from tpu_pipeline.rl import run

    res = run("grpo_gsm8k", tmp_path / "r", policy=str(chat_policy), steps=3, device="cuda", kernels=kernels,
              reward="rewards_for_tests:odd_char_sum", overrides=GSM_SMALL, progress=False, log=lambda m: None)
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert res["device"].startswith("cuda") and res["steps"] == 3
    updated = [r for r in rows if "skipped" not in r]
    assert updated and all(r["grad_norm"] > 0 and r.get("nan", 0) == 0 for r in updated)
    assert 0.0 <= res["after"]["pass_at_k"] <= 1.0


def test_lora_on_cuda_merges_into_a_plain_policy(tmp_path, chat_policy, test_rewards):
    from transformers import AutoModelForCausalLM

    from tpu_pipeline.rl import run

    res = run("grpo_gsm8k", tmp_path / "l", policy=str(chat_policy), steps=2, device="cuda", lora_rank=4,
              reward="rewards_for_tests:odd_char_sum", overrides=GSM_SMALL, progress=False, log=lambda m: None)
    assert res["warm_start"]["lora_trainable_parameters"] > 0
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "l" / "policy")
    assert not any("lora" in k for k in after.state_dict())
    assert all(p.dtype == torch.float32 for p in after.parameters())


def test_sampling_on_the_gpu_is_reproducible(chat_policy):
    from tpu_pipeline.rl.accel import autocast, sampling_generator
    from tpu_pipeline.rl.policy import load_policy
    from tpu_pipeline.rl.rollout import generate

    dev = torch.device("cuda")
    model, tok = load_policy(chat_policy, dev)
    ids = [tok("<|im_start|>user\nhi<|im_end|>\n")["input_ids"]] * 2

    def sample():
        with autocast("auto", dev):
            return generate(model, ids, n=4, max_new_tokens=12, temperature=1.0, eos_id=tok.eos_token_id,
                            pad_id=tok.pad_token_id, generator=sampling_generator(dev, 3))

    a, b = sample(), sample()
    assert a.responses.device.type == "cuda"
    assert torch.equal(a.responses, b.responses) and torch.equal(a.response_mask, b.response_mask)
