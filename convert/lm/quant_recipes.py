"""LM quantization recipes and the held-out perplexity that judges them
beside greedy token agreement (issue 12 item 4).

A recipe (targets.LM_RECIPES: every name a profile may list) is an
ai-edge-quantizer recipe applied to the one float32 export (the bundle's
.tflite and, for the Llama family, the decode-ready .tflite); nothing is
exported again. Profiles list them in `lm_precisions`, preferred first;
lm/kind.py measures each and the pipeline ships the first that passes
(greedy agreement on litert_lm, the perplexity bound, the target's checks)
unless a later one is clearly faster.

Held-out text (HELDOUT_LINES): 27 arithmetic lines in the grpo_math format
(the first 32 of train/arith.py's heldout_problems, a seed training never
uses, duplicates dropped) and 8 plain English sentences. A line the model's
tokenizer encodes with its unknown token is skipped (the character tokenizer
of the arithmetic recipes has no letters), so each model is scored on the
lines it can represent. Perplexity = exp(mean next-token NLL over every
token after the first of each line), from the variant's own logits: its
.tflite fed one token at a time through its `decode` signature on
ai-edge-litert (litertlm.decode_logits), the graph LiteRT-LM runs. The
change is against PyTorch's float32 perplexity on the same tokens (a float32
bundle reproduces it to 7 digits, docs/BENCHMARKS.md).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from ai_edge_quantizer import quantizer, recipe

from tpu_pipeline.convert.precision.quantize import quantize
from tpu_pipeline.convert.targets import LM_RECIPES
from tpu_pipeline.convert.tool_output import first_line, quiet_native
from tpu_pipeline.errors import ConversionError

HELDOUT_LINES = (
    "7-5=#### 2", "1+5-4=#### 2", "1-5=#### -4", "5+3=#### 8", "0+8-4=#### 4", "9+10=#### 19", "4+8-1=#### 11",
    "4+9-8=#### 5", "4-5=#### -1", "5+6=#### 11", "0-8=#### -8", "10-0=#### 10", "3-5=#### -2", "3-3=#### 0",
    "8-2=#### 6", "6-0=#### 6", "4+3=#### 7", "0-9=#### -9", "10-10-1=#### -1", "7-0+3=#### 10", "3+3=#### 6",
    "9+6=#### 15", "6+2+7=#### 15", "5+10=#### 15", "2-1=#### 1", "7+0-10=#### -3", "0+2=#### 2",
    "The train left the station a few minutes after noon.",
    "She opened the window and the room filled with cold air.",
    "Water boils at a lower temperature high in the mountains.",
    "He wrote the numbers down twice to be sure they were right.",
    "Most of the shops in the old town close early on Sundays.",
    "The library keeps its rare maps in a cool, dark room.",
    "A small dog waited by the door for the children to come home.",
    "They planted tomatoes, beans and a row of sunflowers in spring.",
)


def quantize_lm(tflite: bytes, precision: str, signature: str) -> bytes:
    """`tflite` (an LM graph with prefill/decode signatures) in `precision` (an LM_RECIPES name);
    ConversionError (one line) when ai-edge-quantizer cannot make it."""
    made_by = LM_RECIPES.get(precision).quantizer_recipe
    if made_by is None:
        return quantize(tflite, precision, None, signature=signature)
    try:
        with quiet_native():
            q = quantizer.Quantizer(bytearray(tflite), getattr(recipe, made_by)())
            return bytes(q.quantize(None, enable_progress_report=False).quantized_model)
    except Exception as e:  # noqa: BLE001 - the quantizer's own failures
        raise ConversionError(f"ai-edge-quantizer could not make the {precision} variant: {type(e).__name__}: "
                              f"{first_line(e)}") from None


def heldout_sequences(tokenizer, max_len: int) -> list[list[int]]:
    """Token ids of each held-out line the tokenizer represents (no unknown token), cut to
    `max_len` (the KV cache holds no more); lines under two tokens score nothing and are dropped."""
    unk = tokenizer.token_to_id(tokenizer.model.unk_token) if getattr(tokenizer.model, "unk_token", None) else None
    out = []
    for line in HELDOUT_LINES:
        ids = tokenizer.encode(line).ids[:max_len]
        if len(ids) >= 2 and (unk is None or unk not in ids):
            out.append(ids)
    return out


def perplexity(logits: list[np.ndarray], sequences: list[list[int]]) -> float:
    nll, n = 0.0, 0
    for seq, lg in zip(sequences, logits):
        logp = torch.log_softmax(torch.as_tensor(lg[:len(seq) - 1]).double(), -1)
        nll -= float(logp[torch.arange(len(seq) - 1), torch.tensor(seq[1:])].sum())
        n += len(seq) - 1
    return math.exp(nll / n)


def torch_logits(model: torch.nn.Module, sequences: list[list[int]]) -> list[np.ndarray]:
    """PyTorch's float32 next-token logits at every position of each held-out sequence."""
    with torch.no_grad():
        return [model(torch.tensor([seq])).logits[0].float().numpy() for seq in sequences]


def torch_perplexity(model: torch.nn.Module, sequences: list[list[int]]) -> float:
    return perplexity(torch_logits(model, sequences), sequences)


def teacher_forced(ref_logits: list[np.ndarray], got_logits: list[np.ndarray], sequences: list[list[int]]) -> dict:
    """A variant against the float model on held-out text, fed the same tokens (teacher-forced), as
    llama.cpp's perplexity tool reports a quantized model against its base (--kl-divergence): the
    share of positions whose next-token top-1 agrees ("same top p"), the mean KL(float || variant)
    per token in nats, and its 99th percentile. Unlike greedy generations, one early flip does not
    hide or decide everything after it, and every position of every line counts."""
    agree, kls, n = 0, [], 0
    for seq, r, g in zip(sequences, ref_logits, got_logits):
        k = len(seq) - 1
        lr = torch.log_softmax(torch.as_tensor(r[:k]).double(), -1)
        lg = torch.log_softmax(torch.as_tensor(g[:k]).double(), -1)
        agree += int((lr.argmax(-1) == lg.argmax(-1)).sum())
        kls.append((lr.exp() * (lr - lg)).sum(-1).numpy())
        n += k
    kl = np.concatenate(kls) if kls else np.zeros(0)
    return {"tokens": n, "top1_agreement": agree / n if n else None,
            "mean_kl": float(kl.mean()) if kl.size else None,
            "kl_p99": float(np.quantile(kl, 0.99)) if kl.size else None}


def tflite_perplexity(decode_logits: list[np.ndarray] | None, sequences: list[list[int]]) -> float | None:
    """Perplexity from a variant's teacher-forced logits (litertlm.decode_logits); None when its
    decode signature could not be driven that way."""
    return None if decode_logits is None else perplexity(decode_logits, sequences)
