"""The policy: a Hugging Face causal LM and its tokenizer, where it comes from
(an explicit path, or the recipe's warm start trained on the spot and cached),
its optimizer (carrying the warm start's AdamW moments), and saving it.

Loading never runs code from the model folder: `trust_remote_code` stays off
and weights are read from safetensors.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import torch

from tpu_pipeline.errors import UserError
from tpu_pipeline.files import atomic_write_json, staged_dir
from tpu_pipeline.recipes import find_recipe
from tpu_pipeline.train import runner as train_runner
from tpu_pipeline.train.recipe import Recipe
from tpu_pipeline.train.tasks import TASK_SOURCES


def home() -> Path:
    return Path(os.environ.get("TPU_PIPELINE_HOME", Path.home() / ".cache" / "tpu-pipeline"))


def warm_start_overrides(cfg) -> dict[str, Any]:
    """The train overrides of an rl recipe's warm start: its task source's (task and
    difficulty follow the rl recipe's data section, so the two cannot drift apart), then
    any explicit policy.warm_start_overrides (budget, model size). These are `--set`
    overrides of the train recipe, checked by train's typed config like any other."""
    ov: dict[str, Any] = {}
    if cfg.data.source:
        ov.update(TASK_SOURCES.get(cfg.data.source).warm_start_overrides(cfg.data))
    ov.update(cfg.policy.warm_start_overrides)
    return ov


def warm_start_recipe(cfg) -> Recipe | None:
    """The typed train recipe of the warm start (None when the policy is given by path)."""
    if cfg.policy.path or not cfg.policy.warm_start:
        return None
    return train_runner.load_recipe(cfg.policy.warm_start, warm_start_overrides(cfg) or None)[1]


def warm_start_key(recipe: str, overrides: dict[str, Any]) -> str:
    """Content hash of the train recipe file and the overrides the rl recipe applies."""
    path = find_recipe("train", recipe)
    h = hashlib.sha256(path.read_bytes())
    h.update(json.dumps(overrides, sort_keys=True, default=str).encode())
    return f"{path.stem}-{h.hexdigest()[:16]}"


def warm_start(recipe: str, overrides: dict[str, Any], *, device: str = "auto", kernels: str = "auto",
               log=print) -> tuple[Path, dict]:
    """The cached warm start folder (train's output: hf/, optimizer.pt, eval.json) and
    facts about it; trains it on the spot when the cache lacks it."""
    key = warm_start_key(recipe, overrides)
    final = home() / "warm_start" / key
    info = {"recipe": recipe, "overrides": overrides, "path": str(final / "hf"), "cached": True, "seconds": 0.0}
    if (final / "hf" / "config.json").is_file():
        return final, info
    log(f"warm start: training {recipe} (cached afterwards at {final})")
    t0 = time.time()
    with staged_dir(final) as stage:
        train_runner.run(recipe, stage, device=device, kernels=kernels, overrides=overrides or None)
        if not (stage / "hf" / "config.json").is_file():
            raise UserError(f"warm start {recipe}: train.run wrote no hf/ folder")
        atomic_write_json(stage / "warm_start.json", {"recipe": recipe, "overrides": overrides,
                                                      "seconds": time.time() - t0})
    info.update(cached=False, seconds=time.time() - t0)
    return final, info


def check_policy_files(path: str | Path, *, need_chat_template: bool) -> None:
    """Refuses, in one line, a policy folder that is not a causal LM or (when the recipe
    formats prompts with the chat template) whose tokenizer has no chat template.
    Reads config and tokenizer only, so `--engine verl --dry-run` checks it too."""
    # heavy: transformers takes seconds to import (it pulls in torchao)
    from transformers import AutoConfig, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    path = Path(path)
    if not (path / "config.json").is_file():
        raise UserError(f"policy {path}: not a Hugging Face model folder (no config.json)")
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise UserError(f"policy {path}: cannot read config.json ({str(e).splitlines()[0]})") from None
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        archs = ", ".join(getattr(config, "architectures", None) or []) or "no architectures listed"
        raise UserError(f"policy {path}: model_type {config.model_type!r} ({archs}) is not a causal LM; "
                        "rl needs a model AutoModelForCausalLM loads (Llama, Qwen2, Mistral, ...)")
    if not need_chat_template:
        return
    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise UserError(f"policy {path}: cannot load its tokenizer ({str(e).splitlines()[0]})") from None
    if not getattr(tok, "chat_template", None):
        raise UserError(f"policy {path}: its tokenizer has no chat template and this recipe formats prompts as "
                        "chat messages; use an instruct/chat model or set policy.require_chat_template = false")


def load_policy(path: str | Path, device=None, dtype=torch.float32):
    """(model, tokenizer) from a Hugging Face folder, in `dtype` (float32: trained weights and
    their optimizer state stay fp32 under bf16 autocast) on `device`."""
    # heavy: transformers takes seconds to import (it pulls in torchao)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one-line CLI output; the load takes milliseconds
    path = Path(path)
    if not (path / "config.json").is_file():
        raise UserError(f"policy {path}: not a Hugging Face model folder (no config.json)")
    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=False, use_safetensors=True,
                                                     dtype=dtype)
    except (OSError, ValueError) as e:
        raise UserError(f"policy {path}: cannot load ({str(e).splitlines()[0]})") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    if device is not None:
        model.to(device)
    return model, tok


def save_policy(model, tokenizer, out: str | Path, *, extra: Callable[[Path], None] | None = None) -> Path:
    """A Hugging Face folder (config.json, model.safetensors, tokenizer files), written atomically;
    `extra(stage)` adds files inside the same atomic write (rl's policy record, task_eval)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    out = Path(out)
    with staged_dir(out) as stage:
        model.save_pretrained(stage, safe_serialization=True)
        tokenizer.save_pretrained(stage)
        if extra is not None:
            extra(stage)
    return out


def build_optimizer(model, *, lr: float, weight_decay: float, carry_from: str | Path | None):
    """AdamW over `model.named_parameters()`; with `carry_from` (train's optimizer.pt),
    the warm start's moments and step counts are loaded first and our lr applied after.

    DESIGN.md: a fresh Adam (zero moments, bias correction at step 1) was the main
    cause of GRPO collapsing this tiny model; carrying the moments keeps its
    per-parameter step sizes where supervised training left them.
    """
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = dict(model.named_parameters())
    if carry_from is None or not Path(carry_from).is_file():
        opt = torch.optim.AdamW([params[n] for n in names], lr=lr, weight_decay=weight_decay)
        return opt, False
    saved = torch.load(carry_from, map_location="cpu", weights_only=True)
    saved_names = list(saved.get("param_names", []))
    sd = saved["state_dict"]
    if sorted(saved_names) != sorted(names):
        missing = sorted(set(names) ^ set(saved_names))[:3]
        raise UserError(f"{carry_from}: optimizer parameters do not match the policy's (e.g. {missing})")
    groups = []
    for g in sd["param_groups"]:
        groups.append({**{k: v for k, v in g.items() if k != "params"},
                       "params": [params[saved_names[i]] for i in g["params"]]})
    opt = torch.optim.AdamW(groups, lr=lr)
    opt.load_state_dict(sd)
    for g in opt.param_groups:
        g["lr"] = lr
        g["initial_lr"] = lr
        g["weight_decay"] = weight_decay
    return opt, True
