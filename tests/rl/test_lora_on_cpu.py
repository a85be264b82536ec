"""LoRA policies: only adapters train (base weights bit-identical after GRPO steps),
the KL reference is the policy with adapters off (= the starting model), and the
merged policy/ loads without peft and computes what the adapted model computed."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from tpu_pipeline.cli import cli
from tpu_pipeline.errors import UserError

from .chat_models import save_chat_policy
from .conftest import SMALL


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def _engine(cfg, model, tok, opt, out, ref, reward):
    from tpu_pipeline.rl.data import build_source
    from tpu_pipeline.rl.engine import Engine
    from tpu_pipeline.rl.rewards import GuardedReward, load_reward

    return Engine(cfg=cfg, model=model, tokenizer=tok, optimizer=opt, source=build_source(cfg.data, 0),
                  reward=GuardedReward(load_reward(reward), 5.0), out=out, device=torch.device("cpu"), ref_model=ref)


def test_adapters_train_alone_and_merge_into_a_plain_policy(tmp_path, tiny_policy, test_rewards):
    from transformers import AutoModelForCausalLM

    from tpu_pipeline.rl.recipe import load_recipe
    from tpu_pipeline.rl.lora import AdaptersOff, add_lora
    from tpu_pipeline.rl.policy import build_optimizer, load_policy, save_policy

    cfg = load_recipe("grpo_math", {**SMALL, "optim.lr": 1e-2, "optim.warmup_steps": 0,
                                    "algorithm.use_kl_loss": True, "algorithm.kl_loss_coef": 0.1})
    model, tok = load_policy(tiny_policy)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    ids = tok(["1+2=", "7-3+1="], padding=True, return_tensors="pt")["input_ids"]
    start_logits = _logits(model, ids)

    lora = add_lora(model, rank=4)
    m = lora.model
    opt, carried = build_optimizer(m, lr=1e-2, weight_decay=0.0, carry_from=None)
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    adapters = {n: p for n, p in m.named_parameters() if "lora_" in n}
    assert not carried and in_opt == {id(p) for p in adapters.values()} and len(adapters) > 0
    # all-linear: every projection of the layer has adapters, the (tied) LM head none.
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in adapters} == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert lora.trainable_parameters() == sum(p.numel() for p in adapters.values())

    eng = _engine(cfg, m, tok, opt, tmp_path, AdaptersOff(lora), "rewards_for_tests:starts_with_hash")
    rows = []
    for _ in range(3):
        rows.append(eng.train_step())
        eng.step += 1
    assert any("skipped" not in r for r in rows), rows
    assert any("kl_loss" in r for r in rows)

    for name, p in m.named_parameters():
        if "lora_" not in name:
            assert torch.equal(p, base[name.replace(".base_layer", "")]), name  # bit-identical
    assert max(float(p.detach().abs().max()) for n, p in adapters.items() if "lora_B" in n) > 0

    adapted = _logits(m, ids)
    assert not torch.allclose(adapted, start_logits)
    # The KL reference is the starting model exactly (adapters off, same weights).
    assert torch.equal(_logits(AdaptersOff(lora), ids), start_logits)

    merged = lora.merged()
    assert not any("lora" in k for k in merged.state_dict())
    save_policy(merged, tok, tmp_path / "policy")
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "policy")
    assert type(plain).__name__ == "LlamaForCausalLM"
    assert set(plain.state_dict()) == set(base)
    torch.testing.assert_close(_logits(plain, ids), adapted, atol=1e-5, rtol=1e-5)


def test_run_with_lora_rank_writes_a_merged_policy(tmp_path, test_rewards):
    from transformers import AutoModelForCausalLM

    chat = save_chat_policy(tmp_path / "chat")
    ov = {"data.heldout_n": 8, "data.max_prompt_length": 1024, "data.max_response_length": 8,
          "trainer.prompts_per_step": 4, "rollout.n": 4, "trainer.eval_k": 0, "trainer.eval_every": 0,
          "trainer.save_every": 1, "trainer.threads": 1, "trainer.kernels": "torch", "optim.lr": 1e-2,
          "optim.warmup_steps": 0}
    args = ["rl", "--recipe", "grpo_gsm8k", "--policy", str(chat), "--lora-rank", "4", "--steps", "2",
            "--reward", "rewards_for_tests:odd_char_sum", "--out", str(tmp_path / "o"), "--json"]
    r = CliRunner().invoke(cli, args + [x for k, v in ov.items() for x in ("--set", f"{k}={v}")])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output[r.output.index("{\n"):])
    assert res["steps"] == 2 and res["warm_start"]["lora_trainable_parameters"] > 0
    assert json.loads((tmp_path / "o" / "config.json").read_text())["policy"]["lora_rank"] == 4
    before = AutoModelForCausalLM.from_pretrained(chat)
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "o" / "policy")
    assert set(after.state_dict()) == set(before.state_dict())
    changed = [k for k, v in after.state_dict().items() if not torch.equal(v, before.state_dict()[k])]
    # Merged LoRA deltas land in the adapted projections only (embeddings and norms untouched).
    assert changed and all(k.endswith("_proj.weight") for k in changed), changed


def test_bad_lora_settings_are_user_errors(tiny_policy):
    from tpu_pipeline.rl.api import prepare_config
    from tpu_pipeline.rl.lora import add_lora
    from tpu_pipeline.rl.policy import load_policy

    with pytest.raises(UserError, match="policy.lora_rank must be >= 0"):
        prepare_config("grpo_math", lora_rank=-1)
    model, _ = load_policy(tiny_policy)
    with pytest.raises(UserError, match="lora_target_modules 'nope_proj'"):
        add_lora(model, rank=4, target_modules="nope_proj")


def test_lora_checkpoints_hold_adapters_only_and_resume_exactly(tmp_path, tiny_policy, test_rewards):
    from safetensors.torch import load_file

    from tpu_pipeline.rl import run

    ov = {**SMALL, "trainer.save_every": 1, "trainer.eval_k": 0, "optim.lr": 1e-2, "optim.warmup_steps": 0}

    def go(out, steps, resume=False):
        return run("grpo_math", out, policy=str(tiny_policy), steps=steps, lora_rank=4, resume=resume,
                   reward="rewards_for_tests:starts_with_hash", overrides=ov, progress=False, log=lambda m: None)

    go(tmp_path / "full", 3)
    go(tmp_path / "cut", 2)
    ckpt = torch.load(tmp_path / "cut" / "checkpoints" / "step_000002.pt", map_location="cpu", weights_only=False)
    keys = list(ckpt["model"])
    assert keys and all(".lora_A." in k or ".lora_B." in k for k in keys), keys[:5]
    go(tmp_path / "cut", 3, resume=True)

    def rows(out):
        return [{k: v for k, v in json.loads(x).items() if "seconds" not in k}
                for x in (out / "metrics.jsonl").read_text().splitlines()]

    assert rows(tmp_path / "cut") == rows(tmp_path / "full")
    wa = load_file(tmp_path / "full" / "policy" / "model.safetensors")
    wb = load_file(tmp_path / "cut" / "policy" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_lora_in_bf16_keeps_a_bf16_base_and_fp32_adapters(tmp_path, tiny_policy, test_rewards, monkeypatch):
    from transformers import AutoModelForCausalLM

    from tpu_pipeline.rl import api

    seen = {}
    real = api.add_lora

    def spy(model, **kw):
        lora = real(model, **kw)
        seen["dtypes"] = {("lora_" in n, p.dtype) for n, p in lora.model.named_parameters()}
        return lora

    monkeypatch.setattr(api, "add_lora", spy)
    ov = {**SMALL, "trainer.eval_k": 0, "trainer.precision": "bfloat16", "optim.lr": 1e-2, "optim.warmup_steps": 0}
    res = api.run("grpo_math", tmp_path / "r", policy=str(tiny_policy), steps=2, lora_rank=4,
                  reward="rewards_for_tests:starts_with_hash", overrides=ov, progress=False, log=lambda m: None)
    assert res["steps"] == 2 and res["totals"]["nan_steps"] == 0
    assert seen["dtypes"] == {(False, torch.bfloat16), (True, torch.float32)}
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "r" / "policy")
    assert {p.dtype for p in after.parameters()} == {torch.bfloat16}
    assert not any("lora" in k for k in after.state_dict())
