"""use_kernels on a tiny transformers Llama: same outputs, same generation, same training step."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

from tpu_pipeline.errors import UserError
from tpu_pipeline.kernels import _bridge, sequence_logprobs, use_kernels


def tiny_llama(seed=0):
    cfg = transformers.LlamaConfig(
        vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg)


@pytest.fixture(scope="module")
def stock():
    return tiny_llama().eval()


@pytest.fixture
def attention_shapes(monkeypatch):
    """Records the (Sq, Sk) of every attention call that reached the Pallas kernel."""
    seen = []
    real = _bridge.flash_attention

    def spy(q, k, *rest):
        seen.append((q.shape[2], k.shape[2]))
        return real(q, k, *rest)

    monkeypatch.setattr(_bridge, "flash_attention", spy)
    return seen


def test_forward_matches_stock_model(stock, attention_shapes):
    model = use_kernels(copy.deepcopy(stock), "pallas")
    assert model._tpu_pipeline_kernels_info == {"impl": "pallas", "rms_norm": 5, "attention": 2}
    ids = torch.randint(3, 40, (2, 13))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, stock(ids).logits, rtol=1e-5, atol=1e-5)
    assert attention_shapes == [(13, 13)] * 2


def test_generation_with_kv_cache_matches_and_decodes_in_the_kernel(stock, attention_shapes):
    model = use_kernels(copy.deepcopy(stock), "pallas")
    prompt = torch.randint(3, 40, (1, 6))
    kw = dict(max_new_tokens=5, do_sample=False, attention_mask=torch.ones_like(prompt), pad_token_id=0)
    assert torch.equal(model.generate(prompt, **kw), stock.generate(prompt, **kw))
    # prefill, then one query against the growing cache per new token (causal aligned bottom-right)
    assert attention_shapes[:2] == [(6, 6)] * 2
    assert (1, 7) in attention_shapes and (1, 10) in attention_shapes


def test_padded_batch_falls_back_to_torch_with_the_mask(stock, attention_shapes):
    model = use_kernels(copy.deepcopy(stock), "pallas")
    ids = torch.randint(3, 40, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    with torch.no_grad():
        got, want = model(ids, attention_mask=mask).logits, stock(ids, attention_mask=mask).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], rtol=1e-5, atol=1e-5)
    assert attention_shapes == []  # the kernel takes no padding mask: torch ran it


def _train_steps(model, batches):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for ids, mask in batches:
        # GRPO-style objective: fused LM head + log-probs of the sampled tokens
        lp = sequence_logprobs(model, ids, mask, impl=model._tpu_pipeline_kernels_info["impl"])
        loss = -(lp.sum() / mask[:, 1:].sum()) + 0.1 * model(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_arith_lm_training_step_pallas_matches_torch():
    """Two AdamW steps of a tiny Llama on arith_lm-like sequences: --kernels pallas == --kernels torch."""
    base = tiny_llama(seed=1).train()
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randint(3, 40, (4, 12), generator=g), torch.ones(4, 12, dtype=torch.long)) for _ in range(2)]
    runs = {impl: use_kernels(copy.deepcopy(base), impl) for impl in ("pallas", "torch")}
    losses = {impl: _train_steps(m, batches) for impl, m in runs.items()}
    assert losses["pallas"] == pytest.approx(losses["torch"], rel=1e-5)
    assert losses["pallas"][1] < losses["pallas"][0]  # it learns
    for (name, p), q in zip(runs["pallas"].named_parameters(), runs["torch"].parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)


def test_sequence_logprobs_matches_the_logits(stock):
    use_kernels(model := copy.deepcopy(stock), "torch")
    ids = torch.randint(3, 40, (2, 8))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    with torch.no_grad():
        want = torch.log_softmax(stock(ids).logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
        got = sequence_logprobs(model, ids, mask, impl="pallas")
    keep = mask[:, 1:].bool()
    torch.testing.assert_close(got[keep], want[keep], rtol=1e-5, atol=1e-5)
    assert (got[~keep] == 0).all()


def test_use_kernels_rejects_a_model_without_transformers_attention():
    with pytest.raises(UserError, match="no transformers attention"):
        use_kernels(torch.nn.Linear(3, 3), "pallas")
