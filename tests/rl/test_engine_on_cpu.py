"""The local engine end to end on a tiny random policy: artifacts, learning
direction from the reward alone, and the CLI."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from tpu_pipeline.cli import cli

from .conftest import SMALL


def _run(out, policy, **kw):
    from tpu_pipeline.rl import run

    ov = {**SMALL, **kw.pop("overrides", {})}
    return run("grpo_math", out, policy=str(policy), overrides=ov, progress=False, log=lambda m: None, **kw)


def _p_hash_first(model, tok) -> float:
    ids = tok(["1+2=", "3-4+5=", "7+1="], padding=True, return_tensors="pt")
    pos = (ids["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(**ids, position_ids=pos).logits[:, -1]
    return float(torch.softmax(logits, -1)[:, tok.convert_tokens_to_ids("#")].mean())


def test_run_writes_the_contract_artifacts(tmp_path, tiny_policy):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tpu_pipeline.errors import UserError

    out = tmp_path / "run"
    res = _run(out, tiny_policy, steps=3)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for key in ("reward", "accuracy", "response_length", "step_seconds", "rollout_seconds", "lr"):
        assert key in rows[0]
    ev = json.loads((out / "eval.json").read_text())
    assert ev["before"]["policy"] == str(tiny_policy) and ev["before"]["n"] == 40
    assert ev["before"]["k"] == 2 and "pass_at_k" in ev["after"]
    assert ev == res
    assert (out / "curve.png").stat().st_size > 1000
    assert list((out / "tb").iterdir())
    model = AutoModelForCausalLM.from_pretrained(out / "policy")
    tok = AutoTokenizer.from_pretrained(out / "policy")
    assert model.config.model_type == "llama" and tok.eos_token == "</s>"
    # policy/ records the recipe it was trained by, overrides included (convert scores its bundles on that task)
    from tpu_pipeline.rl.task_eval import RECORD_FILE, read_record

    recorded = read_record(out / "policy")
    assert recorded.name == "grpo_math" and recorded.data.heldout_n == 40 and recorded.trainer.steps == 3
    assert json.loads((out / "policy" / RECORD_FILE).read_text())["engine"] == "local"
    (out / "policy" / RECORD_FILE).write_text("{not json")
    with pytest.raises(UserError, match="not a readable rl policy record"):
        read_record(out / "policy")
    assert read_record(tiny_policy) is None  # a folder rl did not write: no task, converts as before


def test_reward_signal_alone_moves_the_policy(tmp_path, tiny_policy, test_rewards):
    from tpu_pipeline.rl.policy import load_policy

    before = _p_hash_first(*load_policy(tiny_policy))
    out = tmp_path / "run"
    res = _run(out, tiny_policy, steps=4, reward="rewards_for_tests:starts_with_hash",
               overrides={"optim.lr": 3e-3, "optim.warmup_steps": 1, "trainer.eval_k": 0})
    after = _p_hash_first(*load_policy(out / "policy"))
    assert res["totals"]["skipped_steps"] < 4
    assert after > before * 1.5, (before, after)


def test_same_seed_same_run(tmp_path, tiny_policy):
    a = _run(tmp_path / "a", tiny_policy, steps=2)
    b = _run(tmp_path / "b", tiny_policy, steps=2)
    ra = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    rb = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    strip = lambda r: {k: v for k, v in json.loads(r).items() if "seconds" not in k}  # noqa: E731
    assert [strip(r) for r in ra] == [strip(r) for r in rb]
    assert a["after"]["accuracy"] == b["after"]["accuracy"]


def test_existing_run_folder_needs_resume(tmp_path, tiny_policy):
    from tpu_pipeline.errors import UserError

    _run(tmp_path / "r", tiny_policy, steps=1)
    with pytest.raises(UserError, match="--resume"):
        _run(tmp_path / "r", tiny_policy, steps=1)


def test_eval_cli_on_a_policy_with_fresh_seed(tiny_policy):
    r = CliRunner().invoke(cli, ["eval", "--recipe", "grpo_math", "--policy", str(tiny_policy), "--seed", "123",
                                 "--n", "20", "--k", "0", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    assert res["n"] == 20 and res["split"] == "fresh(seed=123)" and 0.0 <= res["accuracy"] <= 1.0


def test_eval_cli_bad_policy_is_one_line_exit_2(tmp_path):
    r = CliRunner().invoke(cli, ["eval", "--recipe", "grpo_math", "--policy", str(tmp_path)])
    assert r.exit_code == 2 and r.output.startswith("Error: policy") and "Traceback" not in r.output


def test_rl_cli_steps_json(tmp_path, tiny_policy):
    args = ["rl", "--recipe", "grpo_math", "--out", str(tmp_path / "c"), "--steps", "1", "--policy",
            str(tiny_policy), "--json"] + [x for k, v in SMALL.items() for x in ("--set", f"{k}={v}")]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output[r.output.index("{"):])["steps"] == 1


def test_run_on_a_verl_parquet_file(tmp_path, tiny_policy):
    from tpu_pipeline.train.tasks.rows import Problem, write_parquet

    probs = [Problem([{"role": "user", "content": f"{i % 10}+{i // 10}="}], str(i % 10 + i // 10), "openai/gsm8k")
             for i in range(40)]
    data = write_parquet(probs, tmp_path / "train.parquet", "train")
    res = _run(tmp_path / "p", tiny_policy, steps=2, data=str(data), overrides={"data.heldout_n": 4})
    assert res["steps"] == 2 and res["before"]["n"] == 4
