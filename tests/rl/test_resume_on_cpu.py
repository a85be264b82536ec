"""--resume from a step checkpoint reproduces the uninterrupted run: the first
run is killed (SIGKILL, no cleanup) right after its step-2 checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from .conftest import SMALL

SCRIPT = textwrap.dedent("""
    import json, os, signal, sys
    from tpu_pipeline.rl import run

    out, policy, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    overrides = json.loads(sys.argv[4])

    def killer(step, row):
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    run("grpo_math", out, policy=policy, steps=4, overrides=overrides, resume=sys.argv[5] == "1",
        hooks=[killer] if kill_at else [], progress=False, log=lambda m: None)
""")


def _proc(tmp_path, out, policy, kill_at, resume, reward_path):
    script = tmp_path / "run_rl.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": reward_path}
    ov = {**SMALL, "optim.lr": 3e-3, "optim.warmup_steps": 1, "trainer.reward": "rewards_for_tests:starts_with_hash"}
    return subprocess.run([sys.executable, str(script), str(out), str(policy), str(kill_at), json.dumps(ov),
                           "1" if resume else "0"], env=env, capture_output=True, text=True, timeout=600)


def _rows(path):
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if "seconds" not in k} for r in rows]


@pytest.mark.slow
def test_killed_run_resumes_to_the_uninterrupted_result(tmp_path, tiny_policy):
    from pathlib import Path

    reward_path = str(Path(__file__).parent)
    full, cut = tmp_path / "full", tmp_path / "cut"
    r = _proc(tmp_path, full, tiny_policy, 0, False, reward_path)
    assert r.returncode == 0, r.stderr[-2000:]
    r = _proc(tmp_path, cut, tiny_policy, 2, False, reward_path)
    assert r.returncode == -9  # SIGKILL: nothing after step 2 ran
    assert not (cut / "eval.json").exists() and not (cut / "policy").exists()
    assert sorted(p.name for p in (cut / "checkpoints").iterdir()) == ["latest.json", "step_000002.pt"]
    config_before = (cut / "config.json").read_bytes()
    r = _proc(tmp_path, cut, tiny_policy, 0, True, reward_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (cut / "config.json").read_bytes() == config_before  # --resume keeps the run's config.json
    assert _rows(cut / "metrics.jsonl") == _rows(full / "metrics.jsonl")
    a = json.loads((full / "eval.json").read_text())
    b = json.loads((cut / "eval.json").read_text())
    for key in ("accuracy", "pass_at_k"):
        assert a["after"][key] == b["after"][key]
    from safetensors.torch import load_file

    wa, wb = load_file(full / "policy" / "model.safetensors"), load_file(cut / "policy" / "model.safetensors")
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # the run really moved: weights differ from the starting policy
    w0 = load_file(Path(tiny_policy) / "model.safetensors")
    assert any(not torch.equal(w0[k], wa[k]) for k in wa)


def test_resume_without_checkpoint_is_a_clear_error(tmp_path, tiny_policy):
    from tpu_pipeline.errors import UserError
    from tpu_pipeline.rl import run

    with pytest.raises(UserError, match="no checkpoint"):
        run("grpo_math", tmp_path / "none", policy=str(tiny_policy), steps=1, resume=True, overrides=SMALL,
            progress=False, log=lambda m: None)


@pytest.fixture
def two_steps(tmp_path, tiny_policy, test_rewards):
    from tpu_pipeline.rl import run

    out = tmp_path / "r"
    ov = {**SMALL, "trainer.eval_k": 0, "trainer.reward": "rewards_for_tests:starts_with_hash"}
    run("grpo_math", out, policy=str(tiny_policy), steps=2, overrides=ov, progress=False, log=lambda m: None)
    return out, ov


def _snapshot(d):
    return {p.relative_to(d): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_resume_with_another_config_is_refused_and_nothing_changes(two_steps, tiny_policy):
    from tpu_pipeline.errors import UserError
    from tpu_pipeline.rl import run

    out, ov = two_steps
    before = _snapshot(out)
    ckpt = out / "checkpoints" / "step_000002.pt"
    with pytest.raises(UserError, match=r"^--resume: .*step_000002\.pt was written by a different config "
                                        r"\(optim\.lr: checkpoint has 3e-05, this run 0\.001\); resume with the same recipe"):
        run("grpo_math", out, policy=str(tiny_policy), steps=4, overrides={**ov, "optim.lr": 1e-3}, resume=True,
            progress=False, log=lambda m: None)
    assert _snapshot(out) == before  # config.json included: a refused resume writes nothing
    ckpt.write_bytes(ckpt.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(UserError, match=r"is corrupt \(sha256 "):
        run("grpo_math", out, policy=str(tiny_policy), steps=4, overrides=ov, resume=True, progress=False,
            log=lambda m: None)


def test_cli_resume_with_another_seed_is_one_line_exit_2(two_steps, tiny_policy):
    from click.testing import CliRunner

    from tpu_pipeline.cli import cli

    out, ov = two_steps
    args = ["rl", "--out", str(out), "--policy", str(tiny_policy), "--steps", "4", "--resume", "--seed", "5",
            "--reward", "rewards_for_tests:starts_with_hash"]
    for k, v in ov.items():
        if k != "trainer.reward":
            args += ["--set", f"{k}={json.dumps(v)}"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "different config (trainer.seed: checkpoint has 0, this run 5)" in lines[0]
