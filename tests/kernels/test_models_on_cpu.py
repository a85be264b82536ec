"""use_kernels on a tiny transformers Llama: same outputs, same generation, same training step."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

from tpu_pipeline.errors import UserError
from tpu_pipeline.kernels import _bridge, sequence_logprobs, use_kernels
from tpu_pipeline.kernels._hf import KERNEL_FAMILIES


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


@pytest.mark.parametrize("family", KERNEL_FAMILIES.names())
def test_every_registered_family_matches_transformers(family, attention_shapes):
    """A family is registered only when its stock model and the kernels agree (biases, q/k norms...)."""
    cfg = transformers.AutoConfig.for_model(
        KERNEL_FAMILIES.get(family), vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64, pad_token_id=0,
        sliding_window=None, attn_implementation="sdpa")  # a window's mask is torch's path (Mistral's default 4096)
    torch.manual_seed(0)
    stock = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # trained-like: random biases and norm weights, not zeros and ones
        for name, p in stock.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    model = use_kernels(copy.deepcopy(stock), "pallas")
    ids = torch.randint(3, 40, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, stock(ids).logits, rtol=1e-5, atol=1e-5)
    assert attention_shapes == [(11, 11)] * 2


def test_forward_matches_stock_model(stock, attention_shapes):
    model = use_kernels(copy.deepcopy(stock), "pallas")
    assert model._tpu_pipeline_kernels_info == {"impl": "pallas", "rms_norm": 5, "attention": 2}
    ids = torch.randint(3, 40, (2, 13))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, stock(ids).logits, rtol=1e-5, atol=1e-5)
    assert attention_shapes == [(13, 13)] * 2


@pytest.mark.parametrize("pad", ["left", "right"])
def test_padded_batch_runs_the_kernel(stock, attention_shapes, pad):
    """Right padding eagerly; left padding under torch.compile(fullgraph=True), which
    also checks that the mask builder and attention function trace without breaks."""
    model = use_kernels(copy.deepcopy(stock), "pallas")
    ids = torch.randint(3, 40, (2, 9))
    mask = torch.ones_like(ids)
    if pad == "left":
        mask[0, :3] = 0
        torch._dynamo.reset()
        model = torch.compile(model, fullgraph=True, backend="aot_eager")
    else:
        mask[0, 6:] = 0
    with torch.no_grad():
        got, want = model(ids, attention_mask=mask).logits, stock(ids, attention_mask=mask).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], rtol=1e-5, atol=1e-5)
    assert attention_shapes == [(9, 9)] * 2


def test_generation_with_kv_cache_matches_and_decodes_in_the_kernel(stock, attention_shapes):
    """Greedy generation of a left-padded batch: same tokens as the stock model, and the
    decode steps (one query against the growing cache, causal aligned bottom-right) ran
    in the kernel."""
    model = use_kernels(copy.deepcopy(stock), "pallas")
    prompt = torch.randint(3, 40, (2, 7))
    mask = torch.ones_like(prompt)
    mask[1, :3] = 0
    prompt[1, :3] = 0
    kw = dict(max_new_tokens=3, do_sample=False, attention_mask=mask, pad_token_id=0)
    assert torch.equal(model.generate(prompt, **kw), stock.generate(prompt, **kw))
    assert attention_shapes[:2] == [(7, 7)] * 2
    assert (1, 8) in attention_shapes and (1, 9) in attention_shapes


def test_static_cache_generation_falls_back_and_matches(stock, attention_shapes):
    """A static cache's keys are not aligned to the end (its kv length is the cache size):
    the kernel's bottom-right causal mask would be wrong, so every step goes to torch."""
    model = use_kernels(copy.deepcopy(stock), "pallas")
    prompt = torch.randint(3, 40, (1, 5))
    kw = dict(max_new_tokens=2, do_sample=False, attention_mask=torch.ones_like(prompt), pad_token_id=0,
              cache_implementation="static")
    assert torch.equal(model.generate(prompt, **kw), stock.generate(prompt, **kw))
    assert attention_shapes == []


def test_padding_with_holes_falls_back_to_torch(stock, attention_shapes):
    model = use_kernels(copy.deepcopy(stock), "pallas")
    ids = torch.randint(3, 40, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, 4] = 0  # a hole: not left or right padding, the kernel cannot express it
    with torch.no_grad():
        got, want = model(ids, attention_mask=mask).logits, stock(ids, attention_mask=mask).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], rtol=1e-5, atol=1e-5)
    assert attention_shapes == []


def _train_steps(model, batches):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, first_grads = [], None
    for ids, mask in batches:
        # GRPO-style objective: fused LM head + log-probs of the sampled tokens
        lp = sequence_logprobs(model, ids, mask, impl=model._tpu_pipeline_kernels_info["impl"])
        labels = ids.masked_fill(mask == 0, -100)
        loss = -(lp.sum() / mask[:, 1:].sum()) + 0.1 * model(ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        if first_grads is None:
            first_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        losses.append(loss.item())
    return losses, first_grads


def test_arith_lm_training_step_pallas_matches_torch(attention_shapes):
    """Two AdamW steps of a tiny Llama on arith_lm-like sequences: --kernels pallas == --kernels torch."""
    base = tiny_llama(seed=1).train()
    g = torch.Generator().manual_seed(2)
    batches = []
    for _ in range(2):
        ids = torch.randint(3, 40, (4, 12), generator=g)
        mask = torch.ones(4, 12, dtype=torch.long)
        mask[1, 9:] = 0  # right padding, as a batch of unequal completions has
        batches.append((ids.masked_fill(mask == 0, 0), mask))
    runs = {impl: use_kernels(copy.deepcopy(base), impl) for impl in ("pallas", "torch")}
    (losses, grads), (ref_losses, ref_grads) = (_train_steps(runs[i], batches) for i in ("pallas", "torch"))
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    assert attention_shapes  # the padded batches ran the attention kernel
    assert losses[1] < losses[0]  # it learns
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-4, atol=1e-7, msg=name)
    # Adam's first steps move every weight by about lr whatever its gradient's size, so
    # weights with near-zero gradients may differ by rounding noise times lr: the bound
    # on weights is looser than on gradients.
    for (name, p), q in zip(runs["pallas"].named_parameters(), runs["torch"].parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=3e-4, msg=name)


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


def test_use_kernels_rejects_models_it_cannot_serve_and_leaves_them_untouched():
    with pytest.raises(UserError, match="not supported; supported transformers families: llama"):
        use_kernels(torch.nn.Linear(3, 3), "pallas")
    # Gemma's RMSNorm scales by (1 + weight): swapping it by name would be silently wrong.
    cfg = transformers.GemmaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    gemma = transformers.GemmaForCausalLM(cfg)
    with pytest.raises(UserError, match="'gemma'"):
        use_kernels(gemma, "pallas")
    assert gemma.config._attn_implementation != "tpu_pipeline"
    assert not hasattr(gemma.model.norm, "_tpu_pipeline_kernels")


def test_attention_dropout_falls_back_to_torch_and_keeps_the_padding(stock, attention_shapes):
    """Dropout is torch's job; the left padding must survive the hand-over (with p=0 the
    outputs must then equal the kernel's)."""
    from tpu_pipeline.kernels import _hf

    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)
    start = torch.tensor([0, 2], dtype=torch.int32)
    module = copy.deepcopy(stock).model.layers[0].self_attn
    module._tpu_pipeline_kernels = "torch"
    want, _ = _hf._attention_forward(module, q, k, k, start, scaling=0.3)
    got, _ = _hf._attention_forward(module, q, k, k, start, dropout=1e-12, scaling=0.3)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
