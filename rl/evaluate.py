"""Held-out accuracy of a policy: greedy pass@1, and pass@k from k samples at a
temperature (a problem passes when any of its k samples scores 1)."""

from __future__ import annotations

import time
from typing import Callable, Sequence

import torch

from tpu_pipeline.errors import UserError
from tpu_pipeline.rl.accel import autocast, sampling_generator
from tpu_pipeline.rl.rollout import generate
from tpu_pipeline.train.tasks.rows import Problem


def encode_prompts(tokenizer, problems: Sequence[Problem], max_len: int, overlong: str) -> list[list[int]]:
    out = []
    for i, p in enumerate(problems):
        ids = tokenizer(p.prompt_text(tokenizer))["input_ids"]
        if len(ids) > max_len:
            if overlong == "refuse":
                raise UserError(f"prompt {i} ({p.data_source}) has {len(ids)} tokens, over data.max_prompt_length="
                                f"{max_len}; raise the limit or set data.overlong_prompt = \"truncate\"")
            ids = ids[:1] + ids[len(ids) - max_len + 1:] if tokenizer.bos_token_id == ids[0] else ids[-max_len:]
        out.append(ids)
    return out


def decode(tokenizer, responses: torch.Tensor, mask: torch.Tensor) -> list[str]:
    return [tokenizer.decode(r[m.bool()].tolist(), skip_special_tokens=True) for r, m in zip(responses, mask)]


@torch.no_grad()
def evaluate(model, tokenizer, problems: Sequence[Problem], score: Callable, *, max_prompt_length: int,
             max_response_length: int, overlong: str = "truncate", k: int = 0, temperature: float = 1.0,
             seed: int = 0, batch_size: int = 512, precision: str = "float32",
             texts_out: list[str] | None = None) -> dict:
    """{"accuracy": greedy pass@1, "n": ..., "correct": ..., "pass_at_k": ..., "k": ..., "seconds": ...}.

    `score(items) -> list[float]` with items (data_source, text, ground_truth, extra_info).
    `precision`: trainer.precision (bf16 autocast on CUDA for "auto").
    `texts_out`: receives each problem's greedy response text, in order (task_eval compares
    another generator's answers with them problem by problem).
    """
    was_training = model.training
    model.eval()
    t0 = time.time()
    ids = encode_prompts(tokenizer, problems, max_prompt_length, overlong)
    device = next(model.parameters()).device
    gen = sampling_generator(device, seed)
    correct = 0.0
    passed = 0.0
    for s in range(0, len(problems), batch_size):
        chunk = problems[s:s + batch_size]
        with autocast(precision, device):
            r = generate(model, ids[s:s + batch_size], n=1, max_new_tokens=max_response_length, temperature=0.0,
                         eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, greedy=True)
        texts = decode(tokenizer, r.responses, r.response_mask)
        if texts_out is not None:
            texts_out.extend(texts)
        scores = score([(p.data_source, t, p.ground_truth, p.extra_info) for p, t in zip(chunk, texts)])
        correct += sum(1.0 for x in scores if x >= 1.0)
        if k:
            per = max(1, batch_size // k)
            for s2 in range(0, len(chunk), per):
                sub = chunk[s2:s2 + per]
                with autocast(precision, device):
                    r = generate(model, ids[s + s2:s + s2 + per], n=k, max_new_tokens=max_response_length,
                                 temperature=temperature, eos_id=tokenizer.eos_token_id,
                                 pad_id=tokenizer.pad_token_id, generator=gen)
                texts = decode(tokenizer, r.responses, r.response_mask)
                items = [(p.data_source, texts[i * k + j], p.ground_truth, p.extra_info)
                         for i, p in enumerate(sub) for j in range(k)]
                sc = score(items)
                passed += sum(1.0 for i in range(len(sub)) if max(sc[i * k:(i + 1) * k]) >= 1.0)
    n = len(problems)
    if was_training:
        model.train()
    out = {"accuracy": correct / max(n, 1), "n": n, "correct": int(correct)}
    if k:
        out.update(pass_at_k=passed / max(n, 1), k=k, temperature=temperature)
    out["seconds"] = round(time.time() - t0, 2)
    return out
