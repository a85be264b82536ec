"""The arithmetic task API that rl builds on (docs/INTERFACES.md), and the char-level LM it trains."""

from __future__ import annotations

import pytest

from tpu_pipeline.errors import UserError
from tpu_pipeline.train.tasks import arith, char_lm


def test_problems_are_deterministic_and_in_prompt_form():
    a = arith.make_problems(200, seed=3)
    b = arith.make_problems(200, seed=3)
    assert a == b and len(a) == 200
    assert a != arith.make_problems(200, seed=4)
    assert {p.data_source for p in a} == {"basic_arithmetic", "chain_sum"}
    for p in a:
        assert p.prompt.endswith("=") and " " not in p.prompt
        # The answer is what Python computes from the prompt.
        assert int(p.answer) == eval(p.prompt[:-1])  # noqa: S307 - digits and +/- only
        terms = p.prompt[:-1].replace("-", "+").split("+")
        # reasoning-gym's basic_arithmetic draws "1-digit" operands from 0..10 inclusive.
        assert 2 <= len(terms) <= 3 and all(0 <= int(t) <= 10 for t in terms)


def test_difficulty_is_configurable():
    d = arith.Difficulty(min_terms=4, max_terms=4, min_digits=2, max_digits=2)
    ps = arith.make_problems(50, seed=0, tasks=["chain_sum"], difficulty=d)
    for p in ps:
        terms = p.prompt[:-1].replace("-", "+").split("+")
        assert len(terms) == 4 and all(10 <= int(t) <= 99 for t in terms)
        assert p.data_source == "chain_sum"


def test_heldout_is_fixed_and_disjoint_from_training():
    train = arith.make_problems(2000, seed=0)
    held = arith.heldout_problems(300, exclude=train)
    assert held == arith.heldout_problems(300, exclude=train)
    assert len(held) == 300
    assert not {p.prompt for p in held} & {p.prompt for p in train}


@pytest.mark.parametrize("d,msg", [
    ({"min_terms": 1}, "need 2 <= min_terms <= max_terms, got 1..3"),
    ({"operators": ["^"]}, "operators must be a non-empty subset of + - * /, got ['^']"),
    ({"bogus": 1}, "arithmetic difficulty: unknown key 'bogus'; valid keys: max_digits, max_terms, min_digits, min_terms, operators"),
])
def test_bad_difficulty_is_a_user_error(d, msg):
    with pytest.raises(UserError) as e:
        arith.Difficulty.from_dict(d)
    assert msg in str(e.value)


def test_unknown_task_and_operator_mismatch_are_user_errors():
    with pytest.raises(UserError, match="unknown arithmetic task 'gsm8k'; valid: basic_arithmetic, chain_sum"):
        arith.make_problems(10, seed=0, tasks=["gsm8k"])
    with pytest.raises(UserError, match=r"operators \* or / need task basic_arithmetic"):
        arith.make_problems(10, seed=0, tasks=["chain_sum"], difficulty=arith.Difficulty(operators=("*",)))


def test_difficulty_is_typed_and_matches_the_train_recipe():
    from tpu_pipeline.train.runner import load_recipe

    _, r = load_recipe("arith_lm", {"arith.max_terms": 4, "arith.operators": ["+"]})
    assert r.settings.difficulty() == arith.Difficulty(max_terms=4, operators=("+",))
    assert arith.Difficulty.from_dict({"operators": ["+", "-"]}) == arith.DEFAULT_DIFFICULTY


def test_tokenizer_round_trips_and_target_scores(tmp_path):
    from transformers import AutoTokenizer

    tok = char_lm.build_tokenizer()
    p = arith.Problem("3+4-2=", "5", "chain_sum")
    ids, n_prompt = arith.encode_example(tok, p)
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id and n_prompt == 7
    assert tok.decode(ids[n_prompt:], skip_special_tokens=True) == "#### 5"
    assert arith.score(tok.decode(ids[n_prompt:]), "5") == 1.0
    assert arith.score("#### 6", "5") == 0.0
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again("3+4-2=")["input_ids"] == tok("3+4-2=")["input_ids"]
    assert again.eos_token_id == tok.eos_token_id and again.pad_token_id == tok.pad_token_id


def test_model_is_a_small_llama():
    import torch

    m = char_lm.build_model()
    assert type(m).__name__ == "LlamaForCausalLM"
    n = sum(p.numel() for p in m.parameters())
    assert 1_000_000 < n < 3_000_000
    tok = char_lm.build_tokenizer()
    logits = m(torch.tensor([tok("1+1=")["input_ids"]])).logits
    assert logits.shape == (1, 5, len(tok))
