"""The warm start: looked up in the cache by the train recipe's content hash and
the rl recipe's task/difficulty, its AdamW moments carried into RL."""

from __future__ import annotations

import json
import shutil

import torch

from tpu_pipeline.rl.recipe import load_recipe
from tpu_pipeline.rl.policy import build_optimizer, home, load_policy, warm_start_key, warm_start_overrides

from .conftest import SMALL


def _fake_cached_warm_start(tiny_policy, cfg):
    key = warm_start_key(cfg.policy.warm_start, warm_start_overrides(cfg))
    folder = home() / "warm_start" / key
    shutil.copytree(tiny_policy, folder / "hf")
    model, _ = load_policy(folder / "hf")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    model(input_ids=torch.tensor([[1, 5, 6]]), labels=torch.tensor([[1, 5, 6]])).loss.backward()
    opt.step()
    torch.save({"param_names": [n for n, _ in model.named_parameters()], "state_dict": opt.state_dict()},
               folder / "optimizer.pt")
    return folder, opt


def test_difficulty_is_part_of_the_warm_start_and_its_key():
    a = load_recipe("grpo_math")
    b = load_recipe("grpo_math", {"data.difficulty": {"max_terms": 4}})
    assert warm_start_overrides(b) == {"arith.max_terms": 4}
    assert warm_start_key("arith_lm", warm_start_overrides(a)) != warm_start_key("arith_lm", warm_start_overrides(b))


def test_optimizer_state_is_carried_with_our_lr(tmp_path, tiny_policy):
    cfg = load_recipe("grpo_math")
    folder, saved = _fake_cached_warm_start(tiny_policy, cfg)
    model, _ = load_policy(folder / "hf")
    opt, carried = build_optimizer(model, lr=3e-5, weight_decay=0.0, carry_from=folder / "optimizer.pt")
    assert carried
    assert opt.param_groups[0]["lr"] == 3e-5 and opt.param_groups[0]["betas"] == (0.9, 0.95)
    name0, p0 = next(iter(model.named_parameters()))
    want = saved.state_dict()["state"][0]["exp_avg_sq"]
    assert torch.equal(opt.state[p0]["exp_avg_sq"], want) and want.abs().sum() > 0


def test_run_uses_the_cached_warm_start_and_reports_unseen_prompts(tmp_path, tiny_policy):
    from tpu_pipeline.rl import run

    cfg = load_recipe("grpo_math")
    folder, _ = _fake_cached_warm_start(tiny_policy, cfg)
    res = run("grpo_math", tmp_path / "r", steps=1, overrides=SMALL, progress=False, log=lambda m: None)
    assert res["before"]["policy"] == str(folder / "hf")
    assert res["warm_start"]["cached"] is True and res["warm_start"]["optimizer_state_carried"] is True
    u = res["unseen_by_warm_start"]
    assert u["n"] > 0 and 0 < u["distinct_prompts"] <= u["n"] and "before" in u
    assert json.loads((tmp_path / "r" / "eval.json").read_text())["unseen_by_warm_start"] == u
