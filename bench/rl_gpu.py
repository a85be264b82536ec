"""GRPO step time on one CUDA GPU: tpu-pipeline's local engine against TRL's
GRPOTrainer, same GPU, model, prompts, group size, batch and response length.

    python bench/rl_gpu.py --json-out gpu-check/rl_gpu.json          # on the GPU (bench/rl_gpu_check.sh)
    python bench/rl_gpu.py --tiny --device cpu --sides ours --steps 2  # CPU smoke run of the script itself

Model: a Llama-shaped policy with Qwen2.5-0.5B's dimensions (hidden 896, 24
layers, 14 heads, 2 KV heads, MLP 4864, vocabulary 151,936, tied embeddings:
~0.49B parameters), random weights (speed only, no hub download), and an
offline word-level tokenizer over the shipped GSM8K problems, padded to the
same vocabulary, with a Qwen-style chat template.

Batch: 64 prompts x 8 samples from grpo_gsm8k's shipped problems, formatted
with the chat template on both sides; random weights almost never sample EOS,
so every response runs to --max-new-tokens on both sides (equal work). The
reward is a fixed pseudo-random function of the response text (about half
score 1), so every group carries a gradient and neither side skips an update.

Both sides: bf16 autocast over fp32 weights and AdamW, temperature 1, no KL
(TRL beta=0; ours use_kl_loss=false, track_kl=false), token-mean loss (TRL
loss_type="dapo"), one optimizer step per batch with gradients accumulated over
micro-batches of --micro rows (TRL: per_device_train_batch_size=--micro,
gradient_accumulation_steps=512/--micro, one generation of 512 completions).
Ours: KV-cache sampling on the GPU, use_kernels (our RMSNorm/attention) and the
fused log-prob kernel with --kernels auto; TRL: HF generate (no vLLM). The first
step of each side is a warm-up and is not counted; medians of the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936, max_position_embeddings=4096, rope_theta=1e6,
                  rms_norm_eps=1e-6, tie_word_embeddings=True)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=8192, max_position_embeddings=4096, tie_word_embeddings=True)
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]


def reward(data_source, solution_str, ground_truth, extra_info=None, **kw) -> float:
    """About half of random responses score 1; the same function on both sides."""
    return float(sum(map(ord, solution_str)) % 2)


def build_policy(out: Path, dims: dict, problems) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words: set[str] = {"user", "assistant", "system"}
    for p in problems:
        for m in p.prompt:
            words.update(re.findall(r"\w+|[^\w\s]", m["content"]))
    vocab_words = SPECIALS + sorted(words)
    vocab_words += [f"<|x{i}|>" for i in range(dims["vocab_size"] - len(vocab_words))]
    vocab = {t: i for i, t in enumerate(vocab_words[: dims["vocab_size"]])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token="<unk>", additional_special_tokens=["<|im_start|>"],
                                   padding_side="left", model_max_length=dims["max_position_embeddings"])
    fast.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(**dims, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id, bos_token_id=None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    fast.save_pretrained(out)
    return out


def batches(steps: int, prompts: int):
    from tpu_pipeline.rl.recipe import load_recipe
    from tpu_pipeline.rl.data import build_source

    src = build_source(load_recipe("grpo_gsm8k").data, 0)
    return [src.train_batch(s, prompts, 0) for s in range(steps)]


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _peak_gib(device: str):
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None


def _reset_peak(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def bench_ours(policy: Path, data, a, kernels: str) -> dict:
    import torch

    from tpu_pipeline.kernels import use_kernels
    from tpu_pipeline.rl.recipe import load_recipe
    from tpu_pipeline.rl.engine import Engine
    from tpu_pipeline.rl.policy import build_optimizer, load_policy
    from tpu_pipeline.rl.rewards import GuardedReward

    P = len(data[0])
    cfg = load_recipe("grpo_gsm8k", {
        "rollout.n": a.n, "trainer.prompts_per_step": P, "data.max_response_length": a.max_new_tokens,
        "data.max_prompt_length": 1024, "trainer.kernels": kernels, "trainer.micro_batch_size": a.micro,
        "trainer.track_kl": False, "algorithm.use_kl_loss": False, "algorithm.drop_uniform_groups": False,
        "optim.lr": a.lr, "optim.warmup_steps": 0, "trainer.device": a.device})

    class Fixed:  # the same prompts TRL sees, step by step
        def train_batch(self, step, k, seed):
            return data[step]

    _reset_peak(a.device)
    device = torch.device(a.device)
    model, tok = load_policy(policy, device)
    if kernels != "torch":
        use_kernels(model, kernels)
    opt, _ = build_optimizer(model, lr=a.lr, weight_decay=0.0, carry_from=None)
    eng = Engine(cfg=cfg, model=model, tokenizer=tok, optimizer=opt, source=Fixed(),
                 reward=GuardedReward(reward, 30.0), out=Path(tempfile.mkdtemp(prefix="rl_gpu_ours_")), device=device)
    walls, rolls, tokens = [], [], []
    for s in range(len(data)):
        eng.step = s
        _sync(a.device)
        t0 = time.perf_counter()
        row = eng.train_step()
        _sync(a.device)
        walls.append(time.perf_counter() - t0)
        rolls.append(row["rollout_seconds"])
        tokens.append(row["response_length"] * P * a.n)
        if "skipped" in row:
            raise RuntimeError(f"ours skipped step {s}: {row['skipped']}")
    out = _summary(walls, rolls, tokens)
    out.update(kernels=kernels, peak_gib=_peak_gib(a.device), update_seconds_last=round(row["update_seconds"], 3),
               response_length_mean=row["response_length"])
    del eng, model, opt
    return out


def bench_trl(policy: Path, data, a) -> dict:
    import dataclasses

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    _reset_peak(a.device)
    tok = AutoTokenizer.from_pretrained(policy)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    ds = Dataset.from_list([{"prompt": p.prompt} for b in data for p in b])

    def trl_reward(completions, **kw):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [reward("", t, "") for t in texts]

    P = len(data[0])
    total = P * a.n
    want = dict(output_dir=tempfile.mkdtemp(prefix="rl_gpu_trl_"), per_device_train_batch_size=a.micro,
                gradient_accumulation_steps=max(1, total // a.micro), num_generations=a.n,
                max_completion_length=a.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0, learning_rate=a.lr,
                beta=0.0, num_iterations=1, max_steps=len(data), logging_steps=1, report_to=[],
                save_strategy="no", bf16=a.device == "cuda", use_cpu=a.device == "cpu", shuffle_dataset=False,
                dataloader_num_workers=0, disable_dropout=True, loss_type="dapo", scale_rewards="group",
                use_vllm=False, gradient_checkpointing=False, mask_truncated_completions=False,
                max_prompt_length=1024)
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    dropped = sorted(k for k in want if k not in fields)
    args = GRPOConfig(**{k: v for k, v in want.items() if k in fields})
    trainer = GRPOTrainer(model=model, reward_funcs=trl_reward, args=args, train_dataset=ds, processing_class=tok)
    gen_times, step_times = [], []
    inner = trainer.model.generate

    def timed_generate(*args_, **kw):
        _sync(a.device)
        t0 = time.perf_counter()
        outp = inner(*args_, **kw)
        _sync(a.device)
        gen_times.append(time.perf_counter() - t0)
        return outp

    trainer.model.generate = timed_generate

    class Timer(TrainerCallback):
        # Step time = wall between consecutive optimizer-step ends (the first from the start
        # of training): on_step_begin's placement within gradient accumulation differs
        # between transformers versions, on_step_end comes once per optimizer step.
        def on_train_begin(self, args_, state, control, **kw):
            _sync(a.device)
            self.last = time.perf_counter()

        def on_step_end(self, args_, state, control, **kw):
            _sync(a.device)
            now = time.perf_counter()
            step_times.append(now - self.last)
            self.last = now

    trainer.add_callback(Timer())
    trainer.train()
    import trl

    out = _summary(step_times, gen_times, [total * a.max_new_tokens] * len(step_times))
    out.update(trl_version=trl.__version__, config_fields_not_in_this_trl=dropped, peak_gib=_peak_gib(a.device),
               generate_calls=len(gen_times))
    return out


def _summary(steps, rollouts, tokens) -> dict:
    s = steps[1:] or steps  # the first step is a warm-up
    r = rollouts[1:] or rollouts
    t = tokens[1:len(r) + 1] or tokens[:len(r)]
    out = {"steps_timed": len(s), "step_seconds_median": round(statistics.median(s), 3),
           "step_seconds_all": [round(x, 3) for x in steps]}
    if r:  # empty when TRL generated through another path than trainer.model.generate
        out.update(rollout_seconds_median=round(statistics.median(r), 3),
                   rollout_tokens_per_second=round(sum(t) / max(sum(r), 1e-9), 1))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4, help="steps per side, the first one untimed")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--micro", type=int, default=64, help="rows per forward/backward on both sides")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--device", default="cuda")
    p.add_argument("--sides", default="ours,trl", help="comma-separated: ours, ours-torch, trl")
    p.add_argument("--tiny", action="store_true", help="a tiny model (script check on CPU)")
    p.add_argument("--policy", default=None, help="an HF folder instead of the random 0.5B policy")
    p.add_argument("--json-out", default=None)
    a = p.parse_args()

    import torch
    from safetensors.torch import load_file

    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench/rl_gpu.py: no CUDA device visible (use --device cpu --tiny for a script check)")
    data = batches(a.steps, a.prompts)
    work = Path(tempfile.mkdtemp(prefix="rl_gpu_"))
    dims = TINY if a.tiny else QWEN25_05B
    policy = Path(a.policy) if a.policy else build_policy(work / "policy", dims, [q for b in data for q in b])
    n_params = sum(t.numel() for t in load_file(str(policy / "model.safetensors")).values())
    res: dict = {"device": torch.cuda.get_device_name() if a.device == "cuda" else a.device,
                 "torch": torch.__version__, "parameters": n_params, "prompts": a.prompts, "n": a.n,
                 "max_new_tokens": a.max_new_tokens, "micro": a.micro, "steps": a.steps, "dims": dims}
    for side in a.sides.split(","):
        t0 = time.time()
        try:
            if side == "ours":
                res["ours"] = bench_ours(policy, data, a, "auto")
            elif side == "ours-torch":
                res["ours_torch"] = bench_ours(policy, data, a, "torch")
            elif side == "trl":
                res["trl"] = bench_trl(policy, data, a)
            else:
                raise SystemExit(f"unknown side {side!r}")
        except Exception as e:  # one side failing must not lose the other's figures
            res[side.replace("-", "_")] = {"error": f"{type(e).__name__}: {e}"[:2000]}
        res[side.replace("-", "_")]["wall_seconds"] = round(time.time() - t0, 1)
        print(json.dumps({side: res[side.replace("-", "_")]}), flush=True)
    for ours in ("ours", "ours_torch"):
        if "step_seconds_median" in res.get(ours, {}) and "step_seconds_median" in res.get("trl", {}):
            res[f"{ours}_speedup_vs_trl"] = round(res["trl"]["step_seconds_median"] / res[ours]["step_seconds_median"],
                                                  2)
    text = json.dumps(res, indent=2)
    print(text)
    if a.json_out:
        Path(a.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json_out).write_text(text + "\n")


if __name__ == "__main__":
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    main()
