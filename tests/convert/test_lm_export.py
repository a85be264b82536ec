"""Decode-ready LM export: the KV-cache wrapper equals the HF forward, and the
artifact's greedy generations equal PyTorch's token for token."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tpu_pipeline.convert.lm.decode_ready import KVCacheLM, generation_parity, lm_shape, write_decode_ready
from tpu_pipeline.convert.lm.decode_ready_runtime import LiteRTLanguageModel
from tpu_pipeline.errors import UserError


def _tiny_llama(kv_heads=2, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    from tpu_pipeline.train.tasks.char_lm import build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=48,
                      eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(cfg).eval()
    # Random weights generate near-uniform logits; scale the head so argmax is decisive.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model, tok


def _chunked_prefill(w: KVCacheLM, shape, ids: torch.Tensor, chunk_len: int = 8):
    """The wrapper fed `ids` in prefill chunks (the last one padded) -> (logits of ids, k, v)."""
    k, v = torch.zeros(shape.cache_shape()), torch.zeros(shape.cache_shape())
    logits = []
    for start in range(0, ids.shape[1], chunk_len):
        chunk = ids[:, start:start + chunk_len]
        tokens = torch.zeros(1, chunk_len, dtype=torch.int32)
        tokens[:, :chunk.shape[1]] = chunk
        out, k, v = w(tokens, torch.arange(start, start + chunk_len, dtype=torch.int32), k, v)
        logits.append(out[0, :chunk.shape[1]])
    return torch.cat(logits), k, v


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_kv_cache_wrapper_equals_hf_forward(kv_heads):
    model, _ = _tiny_llama(kv_heads)
    shape = lm_shape(model.config, max_len=24, prefill_len=8)
    w = KVCacheLM(model, shape)
    ids = torch.randint(0, model.config.vocab_size, (1, 13))
    logits, k, v = _chunked_prefill(w, shape, ids)
    with torch.no_grad():
        ref = model(ids).logits[0]
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=1e-5)
    nxt, k, v = w(torch.tensor([[3]], dtype=torch.int32), torch.tensor([13], dtype=torch.int32), k, v)
    with torch.no_grad():
        ref = model(torch.cat([ids, torch.tensor([[3]])], 1)).logits[0, -1]
    torch.testing.assert_close(nxt[0, 0], ref, atol=1e-5, rtol=1e-5)


def _tiny_sliding(family: str, window: int = 4, seed: int = 0):
    """A tiny Mistral (window on every layer) or Qwen2 (window on its second layer) with
    `window` shorter than the test sequences, so the window changes the logits."""
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from tpu_pipeline.train.tasks.char_lm import build_tokenizer

    tok = build_tokenizer()
    common = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=48, sliding_window=window,
                  initializer_range=0.2, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
                  pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    if family == "mistral":
        return MistralForCausalLM(MistralConfig(**common)).eval(), tok
    return Qwen2ForCausalLM(Qwen2Config(use_sliding_window=True, max_window_layers=1, **common)).eval(), tok


@pytest.mark.parametrize("family, windows", [("mistral", (4, 4)), ("qwen2", (None, 4))])
def test_kv_cache_wrapper_applies_sliding_windows(family, windows):
    model, _ = _tiny_sliding(family)
    shape = lm_shape(model.config, max_len=24, prefill_len=8)
    assert shape.windows == windows
    ids = torch.randint(0, model.config.vocab_size, (1, 13))
    logits, _, _ = _chunked_prefill(KVCacheLM(model, shape), shape, ids)
    with torch.no_grad():
        ref = model(ids).logits[0]
        full = type(model)(type(model.config)(**{**model.config.to_dict(), "sliding_window": None, "layer_types": None,
                                                   "use_sliding_window": False}))
        full.load_state_dict(model.state_dict())
        unwindowed = full.eval()(ids).logits[0]
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=1e-5)
    assert (unwindowed - ref).abs().max() > 0.1  # the window matters on this sequence


def test_non_llama_is_refused():
    from transformers import GPT2Config

    with pytest.raises(UserError, match="model_type 'gpt2'"):
        lm_shape(GPT2Config(), 16, 8)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """`convert` of the tiny grouped-query Llama for every target that takes LMs (one export shared by
    this file's tests: test_convert_hf_lm_folder_all_targets_then_generate checks its report)."""
    from click.testing import CliRunner

    from tpu_pipeline.cli import cli

    model, tok = _tiny_llama(kv_heads=2)  # grouped-query attention: converts exactly in this path
    tmp = tmp_path_factory.mktemp("convert")
    hf = tmp / "policy"
    model.save_pretrained(hf)
    tok.save_pretrained(hf)
    (tmp / "prompts.txt").write_text("3+4-2=\n9-8=\n1+1+1=\n")
    r = CliRunner().invoke(cli, ["convert", str(hf), "--out", str(tmp / "dist"), "--prompts", str(tmp / "prompts.txt"),
                                 "--max-len", "40", "--prefill-len", "8", "--json"])
    return r, model, tok, hf, tmp


@pytest.fixture(scope="module")
def exported(converted, tmp_path_factory):
    """The decode-ready artifact alone, as write_decode_ready writes it (model.tflite, lm.json, the
    tokenizer; max_len 40, prefill 8): the float32 desktop target's files without its bundle."""
    import json
    import shutil

    r, model, tok, _, tmp = converted
    assert r.exit_code == 0, r.output
    out = tmp_path_factory.mktemp("lm")
    for p in (tmp / "dist" / "desktop").iterdir():
        if p.is_file() and p.name not in ("model.litertlm", "model.json"):
            shutil.copy(p, out / p.name)
    return model, tok, out, json.loads((out / "lm.json").read_text())


def test_artifact_generates_exactly_like_pytorch(exported):
    model, tok, out, meta = exported
    assert meta["cache_shape"] == [2, 1, 2, 40, 16]
    assert meta["eos_token_ids"] == [tok.eos_token_id]
    lm = LiteRTLanguageModel(out)
    prompts = [tok(p).input_ids for p in ["3+4-2=", "9-8=", "1+1+1=", "7+5-3=", "0-9+2="]]
    prompts.append(list(np.random.default_rng(0).integers(4, len(tok), 11)))  # longer than one prefill chunk
    report = generation_parity(model, lm, prompts, max_new_tokens=12)
    assert report["generation_agreement"] == 1.0, report["first_generation_divergence"]
    ref, got = np.concatenate(report["ref_logits"]), np.concatenate(report["got_logits"])
    assert ref.shape == (6, len(tok)) and np.abs(ref - got).max() < 1e-3
    text = lm.generate("3+4-2=", max_new_tokens=6)
    assert isinstance(text, str) and len(lm.generate_ids(lm.encode("3+4-2="), 6)) >= 1


def test_attention_converts_exactly_for_one_two_and_all_kv_heads():
    """The root cause of the multi-query bug, pinned: with one kv head, litert-torch 0.10 lowers
    repeat_interleave(k) followed by q @ k^T to RESHAPE [1,1,M,D] -> [1,1,D,M] + BROADCAST_TO (a
    reshape where a transpose belongs). The export's grouped attention never repeats the cache
    and converts exactly for 1, 2 and all kv heads."""
    import litert_torch

    from tpu_pipeline.convert.lm.decode_ready import _grouped_attention

    heads, t, m, d = 4, 8, 24, 16

    class Grouped(torch.nn.Module):
        def __init__(self, kv):
            super().__init__()
            self.kv = kv

        def forward(self, q, k, v, bias):
            return _grouped_attention(q, k, v, bias, self.kv)

    class Repeated(torch.nn.Module):  # the export's attention before the fix
        def forward(self, q, k):
            return q @ k.repeat_interleave(heads, dim=1).transpose(-1, -2)

    torch.manual_seed(0)
    for kv in (1, 2, 4):
        bias = torch.where(torch.rand(1, 1, t, m) > 0.3, 0.0, torch.finfo(torch.float32).min)
        args = (torch.randn(1, heads, t, d), torch.randn(1, kv, m, d), torch.randn(1, kv, m, d), bias)
        ref = Grouped(kv)(*args)
        rep = heads // kv  # HF repeat_kv: query head j reads kv head j // rep
        want = torch.softmax(args[0] @ args[1].repeat_interleave(rep, 1).transpose(-1, -2) * d ** -0.5 + bias, -1)
        torch.testing.assert_close(ref, want @ args[2].repeat_interleave(rep, 1))
        got = np.asarray(litert_torch.convert(Grouped(kv).eval(), args)(*args))
        assert np.abs(got - ref.numpy()).max() < 1e-5, kv
    q, k = torch.randn(1, heads, t, d), torch.randn(1, 1, m, d)
    wrong = np.abs(np.asarray(litert_torch.convert(Repeated().eval(), (q, k))(q, k)) - Repeated()(q, k).numpy())
    # When this fails, litert-torch lowers the repeated form correctly (the grouped form stays exact).
    assert wrong.max() > 1.0


def test_multi_query_artifact_generates_exactly_like_pytorch(tmp_path):
    """One kv head (multi-query, as SmolLM-style Llamas): before the grouped attention, the
    decode-ready artifact's logits were off by 0.04 (cosine 0.99993) on this model."""
    model, tok = _tiny_llama(kv_heads=1)
    model.save_pretrained(tmp_path / "hf")
    tok.save_pretrained(tmp_path / "hf")
    meta = write_decode_ready(tmp_path / "hf", tmp_path / "lm", max_len=40, prefill_len=8)
    assert meta["cache_shape"] == [2, 1, 1, 40, 16]
    prompts = [tok(p).input_ids for p in ["3+4-2=", "9-8=", "1+1+1="]]
    prompts.append(list(np.random.default_rng(0).integers(4, len(tok), 11)))  # two prefill chunks
    report = generation_parity(model, LiteRTLanguageModel(tmp_path / "lm"), prompts, max_new_tokens=12)
    assert report["generation_agreement"] == 1.0, report["first_generation_divergence"]
    ref, got = np.concatenate(report["ref_logits"]), np.concatenate(report["got_logits"])
    cosine = float((ref * got).sum() / np.linalg.norm(ref) / np.linalg.norm(got))
    assert np.abs(ref - got).max() < 1e-4 and cosine >= 0.99999


def test_sliding_window_artifact_generates_exactly_like_pytorch(tmp_path):
    """Mistral with sliding_window 4: the decode-ready artifact masks keys older than the window
    as transformers does (before, it attended over the whole cache: 0% agreement at window 8)."""
    model, tok = _tiny_sliding("mistral")
    model.save_pretrained(tmp_path / "hf")
    tok.save_pretrained(tmp_path / "hf")
    write_decode_ready(tmp_path / "hf", tmp_path / "lm", max_len=40, prefill_len=8)
    prompts = [tok(p).input_ids for p in ["3+4-2=", "9-8=", "1+1+1="]]
    prompts.append(list(np.random.default_rng(0).integers(4, len(tok), 11)))  # two prefill chunks
    report = generation_parity(model, LiteRTLanguageModel(tmp_path / "lm"), prompts, max_new_tokens=12)
    assert report["generation_agreement"] == 1.0, report["first_generation_divergence"]
    ref, got = np.concatenate(report["ref_logits"]), np.concatenate(report["got_logits"])
    assert np.abs(ref - got).max() < 1e-4


def test_client_refuses_too_long_prompt_and_non_lm_dir(exported, tmp_path):
    _, _, out, meta = exported
    lm = LiteRTLanguageModel(out)
    with pytest.raises(UserError, match="cache holds 40"):
        lm.generate_ids(list(range(4, 44)), 3)
    with pytest.raises(UserError, match="lm.json missing"):
        LiteRTLanguageModel(tmp_path)
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    (broken / "tokenizer.json").unlink()
    with pytest.raises(UserError, match="tokenizer.json missing"):
        LiteRTLanguageModel(broken)


def test_generate_cli_matches_library(exported, tmp_path):
    import json

    from click.testing import CliRunner

    from tpu_pipeline.cli import cli

    _, tok, out, _ = exported
    lm = LiteRTLanguageModel(out)
    want = lm.generate_ids(tok("9-8=").input_ids, 5)
    # The convert output folder works too: its desktop artifact is used.
    (tmp_path / "desktop").symlink_to(out, target_is_directory=True)
    r = CliRunner().invoke(cli, ["generate", str(tmp_path), "--prompt", "9-8=", "--max-new-tokens", "5", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["ids"] == want
    r = CliRunner().invoke(cli, ["generate", str(tmp_path / "nope"), "--prompt", "x"])
    assert r.exit_code == 2 and "no such folder" in r.output


def test_convert_hf_lm_folder_all_targets_then_generate(converted, tmp_path):
    """The whole path for an LM: `convert` makes decode-ready artifacts for every target that
    takes LMs (iot is skipped and says why), then `generate` runs one without PyTorch."""
    import json

    from click.testing import CliRunner

    from tpu_pipeline.cli import cli

    r, model, tok, hf, dist_root = converted
    assert r.exit_code == 0, r.output
    report = json.loads(r.output[r.output.index("{"):])
    assert set(report["targets"]) == {"android", "ios", "desktop", "web"}
    assert "iot" in report["skipped_targets"]
    for name, t in report["targets"].items():
        assert t["passed"], (name, t["errors"])
        assert t["parity"]["generation_agreement"] == 1.0 and t["parity"]["prompts"] == 3
        d = dist_root / "dist" / name
        assert {"model.tflite", "lm.json", "tokenizer.json", "model.json", "model.litertlm"} <= {
            p.name for p in d.iterdir()}
        # the bundle on LiteRT-LM: greedy tokens equal transformers' (near-ties allowed for quantized variants)
        bundle = t["parity"]["litert_lm"]
        assert bundle["agreement_with_near_ties"] == 1.0 and bundle["prompts"] == 3, bundle
        assert bundle["tokenizer_agreement"] == 1.0
    assert report["targets"]["desktop"]["parity"]["litert_lm"]["generation_agreement"] == 1.0
    web = report["targets"]["web"]  # web.toml's lm_precisions, each measured; a passing one ships
    assert [c["precision"] for c in web["candidates"]] == ["weight_only_int8", "float16"]
    assert web["quantization"] in {c["precision"] for c in web["candidates"] if c["passed"]}
    from tpu_pipeline.convert.runtimes.browser import browser_unavailable

    browser = report["targets"]["web"]["parity"]["browser"]
    if browser_unavailable() is None:  # the same greedy tokens from LiteRT.js in headless Chromium
        assert browser["generation_agreement"] == 1.0 and browser["prompts"] == 3
    else:
        assert "skipped" in browser
    assert report["targets"]["web"]["size_bytes"] < report["targets"]["desktop"]["size_bytes"]
    prompt = tok("3+4-2=").input_ids
    want = LiteRTLanguageModel(dist_root / "dist" / "desktop").generate_ids(prompt, 6)
    with torch.no_grad():  # transformers' own greedy generate with its KV cache
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)[0, len(prompt):].tolist()
    assert want == ref[:len(want)]
    g = CliRunner().invoke(cli, ["generate", str(dist_root / "dist"), "--prompt", "3+4-2=", "--max-new-tokens", "6",
                                 "--json", "--runtime", "reference"])
    assert g.exit_code == 0 and json.loads(g.output)["ids"] == want
    # the default runtime is the bundle on LiteRT-LM: the same greedy tokens (it prints special
    # tokens as text and hides the stop token)
    g = CliRunner().invoke(cli, ["generate", str(dist_root / "dist"), "--prompt", "3+4-2=", "--max-new-tokens", "6",
                                 "--json"])
    assert g.exit_code == 0, g.output
    body = want[:-1] if want and want[-1] == tok.eos_token_id else want
    assert json.loads(g.output) == {"prompt": "3+4-2=", "runtime": "litert-lm",
                                    "text": tok.decode(body, skip_special_tokens=False)}
    bad = CliRunner().invoke(cli, ["convert", str(hf), "--targets", "iot", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "does not take a causal LM" in bad.output
    assert not (tmp_path / "x").exists()
