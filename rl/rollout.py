"""Sampling with a KV cache, and the per-token log-probs GRPO trains on.

Prompts are left-padded so every row's last prompt token sits in the same
column; position ids count only real tokens, so a padded row sees the same
positions as it would alone. Log-probs are of `logits / temperature`, the
distribution that was sampled (as VeRL's actor computes them).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from tpu_pipeline.kernels import linear_token_logprobs


@dataclass
class Rollout:
    prompts: torch.Tensor         # (B, P) left-padded prompt ids
    prompt_mask: torch.Tensor     # (B, P) 1 on real prompt tokens
    responses: torch.Tensor       # (B, R) response ids, pad after EOS
    response_mask: torch.Tensor   # (B, R) 1 on generated tokens up to and including EOS
    truncated: torch.Tensor       # (B,) True where the response hit R tokens without EOS

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompts, self.responses], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)


def _last_logits_only(model) -> dict:
    """`logits_to_keep=1` where the model takes it: a prefill needs only the last position's
    logits, and all of them are (prompts, P, V) floats, GBs for a 150k vocabulary."""
    forward = getattr(model, "forward", None)
    try:
        return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(forward).parameters else {}
    except (TypeError, ValueError):
        return {}


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s):] = 1
    return ids, mask


def positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def generate(model, prompt_ids: list[list[int]], *, n: int, max_new_tokens: int, temperature: float,
             eos_id: int, pad_id: int, generator: torch.Generator | None = None, greedy: bool = False) -> Rollout:
    """`n` samples for each prompt (rows i*n..i*n+n-1 belong to prompt i)."""
    device = next(model.parameters()).device
    prompts, pmask = left_pad(prompt_ids, pad_id)
    prompts, pmask = prompts.to(device), pmask.to(device)
    # Prefill each distinct prompt once, then copy its KV cache to its n samples.
    out = model(input_ids=prompts, attention_mask=pmask, position_ids=positions(pmask), use_cache=True,
                **_last_logits_only(model))
    cache = out.past_key_values
    logits = out.logits[:, -1, :]
    if n > 1:
        cache.batch_repeat_interleave(n)
        logits = logits.repeat_interleave(n, 0)
        prompts, pmask = prompts.repeat_interleave(n, 0), pmask.repeat_interleave(n, 0)
    B = prompts.shape[0]
    mask = pmask
    next_pos = positions(mask)[:, -1:] + 1
    done = torch.zeros(B, dtype=torch.bool, device=device)
    tokens, keep = [], []
    for t in range(max_new_tokens):
        if greedy or temperature <= 0:
            tok = logits.argmax(-1)
        else:
            probs = torch.softmax(logits.float() / temperature, dim=-1)
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        tokens.append(tok)
        keep.append(~done)
        done = done | (tok == eos_id)
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones((B, 1), dtype=mask.dtype, device=device)], dim=1)
        out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos,
                    past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        logits = out.logits[:, -1, :]
        next_pos = next_pos + 1
    responses = torch.stack(tokens, 1)
    rmask = torch.stack(keep, 1).long()
    return Rollout(prompts, pmask, responses, rmask, ~done)


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int,
                   temperature: float, kernels: str = "torch") -> torch.Tensor:
    """log p(response token | prefix) at `temperature`, shape (B, R).

    With kernels auto/pallas the lm-head projection and log-softmax go through
    `tpu_pipeline.kernels.linear_token_logprobs` (never materialising (B, R, V)
    logits); "torch" is the plain path and works everywhere.
    """
    pos = positions(attention_mask)
    targets = input_ids[:, -response_len:]
    fused = _linear_token_logprobs(kernels)
    if fused is not None and hasattr(model, "model") and hasattr(model, "lm_head"):
        hidden = model.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos).last_hidden_state
        h = hidden[:, -response_len - 1:-1, :]
        # The kernel is called outside autocast's reach: give it autocast's dtype (bf16 on
        # CUDA) for both operands, as the lm-head matmul would run, else the weight's dtype.
        w = model.lm_head.weight
        dt = h.device.type
        dtype = torch.get_autocast_dtype(dt) if torch.is_autocast_enabled(dt) else w.dtype
        return fused(h.to(dtype) / temperature, w.to(dtype), targets, impl=kernels).float()
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos).logits
    logits = logits[:, -response_len - 1:-1, :].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def _linear_token_logprobs(kernels: str):
    return None if kernels == "torch" else linear_token_logprobs


def grouped_token_logprobs(model, prompts: torch.Tensor, prompt_mask: torch.Tensor, responses: torch.Tensor,
                           response_mask: torch.Tensor, n: int, temperature: float) -> torch.Tensor:
    """`token_logprobs` for rows in groups of `n` that share a prompt (GRPO's layout),
    computing each prompt's forward pass once: its KV cache and last logits are
    repeated to the group's rows (gradients from every row sum back into the one
    prompt pass), then only the response tokens run through the model.

    Same values as `token_logprobs` on the concatenated rows (tests check it), with
    the prompt positions' compute divided by n.
    """
    B, P = prompts.shape
    R = responses.shape[1]
    up, um = prompts[::n], prompt_mask[::n]
    pos = positions(um)
    out = model(input_ids=up, attention_mask=um, position_ids=pos, use_cache=True, **_last_logits_only(model))
    cache = out.past_key_values
    cache.batch_repeat_interleave(n)
    first = out.logits[:, -1:, :].repeat_interleave(n, 0)
    mask = torch.cat([prompt_mask, response_mask], dim=1)
    rpos = positions(mask)[:, P:P + R - 1]
    if R > 1:
        rest = model(input_ids=responses[:, :-1], attention_mask=mask[:, :P + R - 1], position_ids=rpos,
                     past_key_values=cache, use_cache=True).logits
        logits = torch.cat([first, rest], dim=1)
    else:
        logits = first
    logits = logits.float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)
