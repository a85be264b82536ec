"""Fixtures for the rl tests: a tiny random Llama policy (char tokenizer of
tpu_pipeline.train.tasks.char_lm) saved as a Hugging Face folder, and small overrides
that keep every run to a few seconds on 2 CPU cores."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)

SMALL = {
    "data.heldout_n": 40,
    "trainer.prompts_per_step": 8,
    "rollout.n": 4,
    "trainer.eval_k": 2,
    "trainer.eval_every": 0,
    "trainer.save_every": 2,
    "trainer.threads": 1,
    "trainer.time_budget_s": 0.0,
    "trainer.kernels": "torch",
}


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory) -> Path:
    import torch

    from tpu_pipeline.train.tasks import char_lm

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny_policy")
    tok = char_lm.build_tokenizer()
    model = char_lm.build_model(**TINY)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def verl_python() -> str:
    """The interpreter VeRL's trainer runs on here (.venv-verl); skips where it is not installed."""
    from tpu_pipeline.rl.verl_bridge import cpu_backend_missing, trainer_python

    py = trainer_python()
    missing = cpu_backend_missing(py)
    if missing:
        pytest.skip(f"the verl-cpu extra is not installed for {py} ({missing}); `make install` builds .venv-verl")
    return py


@pytest.fixture(scope="session")
def verl_policy(tmp_path_factory) -> Path:
    """The tiny Llama with head_dim 64 VeRL's launches train: vLLM's CPU attention has no kernel
    for the shared tiny policy's head_dim 16 (test_vllm_that_cannot_load_the_policy_is_one_line_exit_6)."""
    import torch

    from tpu_pipeline.train.tasks import char_lm

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("verl_policy")
    char_lm.build_model(hidden_size=128, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                        num_key_value_heads=2).save_pretrained(out)
    char_lm.build_tokenizer().save_pretrained(out)
    return out


@pytest.fixture
def test_rewards(monkeypatch):
    """Makes tests/rl/rewards_for_tests.py importable as `rewards_for_tests`."""
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("rewards_for_tests", None)
    import rewards_for_tests

    return rewards_for_tests
