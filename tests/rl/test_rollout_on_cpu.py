"""Sampling with a KV cache and left padding matches plain full-sequence
forwards; training log-probs are those of the sampled distribution."""

from __future__ import annotations

import torch

from tpu_pipeline.rl.rollout import generate, token_logprobs


def _policy(tiny_policy):
    from tpu_pipeline.rl.policy import load_policy

    return load_policy(tiny_policy)


def test_greedy_with_padding_and_cache_equals_unpadded_no_cache(tiny_policy):
    model, tok = _policy(tiny_policy)
    model.eval()
    prompts = [tok("1+2=")["input_ids"], tok("3+4-5=")["input_ids"]]
    r = generate(model, prompts, n=1, max_new_tokens=6, temperature=0.0, eos_id=tok.eos_token_id,
                 pad_id=tok.pad_token_id, greedy=True)
    for i, p in enumerate(prompts):
        ids = torch.tensor([p])
        want = []
        for _ in range(int(r.response_mask[i].sum())):
            nxt = int(model(input_ids=ids, use_cache=False).logits[0, -1].argmax())
            want.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], 1)
            if nxt == tok.eos_token_id:
                break
        got = r.responses[i][r.response_mask[i].bool()].tolist()
        assert got == want


def test_sampled_logprobs_match_training_logprobs_at_the_temperature(tiny_policy):
    model, tok = _policy(tiny_policy)
    prompts = [tok("1+2=")["input_ids"], tok("3+4-5=")["input_ids"]]
    g = torch.Generator().manual_seed(0)
    r = generate(model, prompts, n=3, max_new_tokens=5, temperature=0.7, eos_id=tok.eos_token_id,
                 pad_id=tok.pad_token_id, generator=g)
    assert r.responses.shape[0] == 6
    assert torch.equal(r.prompts[0], r.prompts[2])  # rows i*n..i*n+n-1 share prompt i
    lp = token_logprobs(model, r.input_ids, r.attention_mask, r.responses.shape[1], 0.7, kernels="torch")
    # the same log-probs computed one row at a time without padding
    for i in range(6):
        keep = r.attention_mask[i].bool()
        ids = r.input_ids[i][keep][None]
        L = int(r.response_mask[i].sum())
        logits = model(input_ids=ids).logits[0, -L - 1:-1] / 0.7
        want = torch.log_softmax(logits, -1).gather(-1, ids[0, -L:, None]).squeeze(-1)
        assert torch.allclose(lp[i, :L], want, atol=1e-5)


def test_sampling_is_reproducible_from_the_generator(tiny_policy):
    model, tok = _policy(tiny_policy)
    p = [tok("1+2=")["input_ids"]]
    kw = dict(n=4, max_new_tokens=5, temperature=1.0, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    a = generate(model, p, generator=torch.Generator().manual_seed(3), **kw).responses
    b = generate(model, p, generator=torch.Generator().manual_seed(3), **kw).responses
    c = generate(model, p, generator=torch.Generator().manual_seed(4), **kw).responses
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_kernel_logprobs_match_torch(tiny_policy):
    model, tok = _policy(tiny_policy)
    r = generate(model, [tok("1+2=")["input_ids"]], n=2, max_new_tokens=4, temperature=1.0,
                 eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0))
    a = token_logprobs(model, r.input_ids, r.attention_mask, 4, 1.0, kernels="torch")
    b = token_logprobs(model, r.input_ids, r.attention_mask, 4, 1.0, kernels="auto")
    assert torch.allclose(a, b, atol=1e-5)


def test_grouped_logprobs_equal_per_row_values_and_gradients(tiny_policy):
    from tpu_pipeline.rl.rollout import grouped_token_logprobs

    model, tok = _policy(tiny_policy)
    prompts = [tok("1+2=")["input_ids"], tok("3+4-5=")["input_ids"], tok("9-9=")["input_ids"]]
    r = generate(model, prompts, n=4, max_new_tokens=6, temperature=1.0, eos_id=tok.eos_token_id,
                 pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(1))
    R = r.responses.shape[1]
    mask = r.response_mask.bool()
    a = token_logprobs(model, r.input_ids, r.attention_mask, R, 0.9, kernels="torch")
    b = grouped_token_logprobs(model, r.prompts, r.prompt_mask, r.responses, r.response_mask, 4, 0.9)
    assert torch.allclose(a[mask], b[mask], atol=1e-5)
    params = list(model.parameters())
    ga = torch.autograd.grad((a * mask).sum(), params)
    gb = torch.autograd.grad((b * mask).sum(), params)
    for x, y in zip(ga, gb):
        assert torch.allclose(x, y, atol=1e-4, rtol=1e-4)
