"""arith_lm's outputs that rl and convert take: hf/, optimizer.pt, model.pt, eval.json."""

from __future__ import annotations

import json

import pytest
import torch

from tpu_pipeline.train import run
from tpu_pipeline.train.tasks import arith, char_lm
from tpu_pipeline.train.manifest import load_model

TINY = {"loop.steps": 6, "loop.log_every": 3, "loop.batch_size": 16, "arith.n_train": 300,
        "arith.n_heldout": 24, "arith.hidden_size": 32, "arith.intermediate_size": 64,
        "arith.num_hidden_layers": 1, "arith.num_attention_heads": 2, "arith.num_key_value_heads": 2,
        "arith.pass_k": 2, "arith.n_pass_k": 6}


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("arith") / "run"
    ev = run("arith_lm", out, overrides=TINY, kernels="torch")
    return out, ev


def test_eval_json_reports_heldout_exact_match(lm_run):
    out, ev = lm_run
    saved = json.loads((out / "eval.json").read_text())
    assert saved["n"] == 24 and 0.0 <= saved["accuracy"] <= 1.0
    assert saved["metric"].startswith("greedy exact match")
    assert "pass@2" in saved and saved["n_pass_k"] == 6
    assert saved["kernels"] == "torch"


def test_hf_folder_loads_with_auto_classes_and_matches_model_pt(lm_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, _ = lm_run
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json"):
        assert (out / "hf" / name).is_file(), name
    hf = AutoModelForCausalLM.from_pretrained(out / "hf").eval()
    tok = AutoTokenizer.from_pretrained(out / "hf")
    assert tok("3+4-2=")["input_ids"] == char_lm.build_tokenizer()("3+4-2=")["input_ids"]
    assert hf.config.eos_token_id == tok.eos_token_id
    m = torch.load(out / "model.pt", weights_only=True)
    assert m["task"] == "causal-lm" and m["model_class"] == "tpu_pipeline.train.models.causal_lm:LlamaLM"
    (ids,) = m["example_inputs"]
    assert ids.dtype == torch.int64 and ids.shape[0] == 1 and ids[0, 0] == tok.bos_token_id
    json.dumps(m["model_kwargs"])
    wrapped = load_model(out / "model.pt")
    with torch.no_grad():
        torch.testing.assert_close(wrapped(ids), hf(input_ids=ids).logits)


def test_optimizer_pt_carries_adamw_moments_in_parameter_order(lm_run):
    from transformers import AutoModelForCausalLM

    out, _ = lm_run
    st = torch.load(out / "optimizer.pt", weights_only=True)
    hf = AutoModelForCausalLM.from_pretrained(out / "hf")
    names = [n for n, _ in hf.named_parameters()]
    assert st["param_names"] == names
    opt = torch.optim.AdamW(hf.parameters(), lr=1e-3)
    opt.load_state_dict(st["state_dict"])  # loads into a fresh AdamW over the HF model
    s0 = opt.state[next(iter(hf.parameters()))]
    assert int(s0["step"]) == 6 and s0["exp_avg"].abs().sum() > 0
    assert [p.shape for p in hf.parameters()] == [opt.state[p]["exp_avg"].shape for p in hf.parameters()]


def test_loss_counts_only_target_tokens():
    from tpu_pipeline.train.runner import get_task, load_recipe
    from tpu_pipeline.train.tasks.char_lm import IGNORE

    _, r = load_recipe("arith_lm", {**TINY, "arith.n_train": 20})
    task = get_task(r, "arith_lm")
    assert isinstance(task, arith.ArithTask)
    tok = task.tokenizer
    for i, p in enumerate(task.train_problems):
        labels = task.labels[i][task.labels[i] != IGNORE].tolist()
        assert tok.decode(labels) == f"#### {p.answer}{tok.eos_token}"
