"""Target profiles: one TOML file per target in convert/targets/, loaded into
`TargetProfile` with the project's one config system (tpu_pipeline.config).

A profile is data, not code: precision, parity runtime, op allowlists, limits
and tolerances. Adding a target means adding a file.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
from pathlib import Path
from typing import Literal

from tpu_pipeline import config
from tpu_pipeline.errors import UserError
from tpu_pipeline.registry import Registry

TARGET_ORDER = ("android", "ios", "desktop", "web", "iot")
Precision = Literal["float32", "float16", "dynamic_int8", "static_int8"]
# LM recipes (convert/lm/quant_recipes.py): ai-edge-quantizer recipes applied to an LM's float32 export
LMPrecision = Literal["float32", "float16", "dynamic_int8", "weight_only_int8", "weight_only_int4",
                      "dynamic_int4_block32"]


@dataclasses.dataclass(kw_only=True, frozen=True)
class TargetProfile:
    description: str
    precision: Precision
    precisions: list[Precision] = dataclasses.field(default_factory=list)  # measured candidates, preferred first ([] = precision)
    runtime: Literal["ai-edge-litert", "tflite-micro"]
    runtime_note: str
    delegate: Literal["gpu", "coreml", "none"]
    delegate_check: Literal["analyzer", "list"]
    delegate_ops: list[str]
    require_delegate: bool
    allowed_ops: list[str]
    forbid_custom_ops: bool
    forbid_dtypes: list[str]
    allow_dynamic_dims: bool
    max_size_bytes: int
    max_arena_bytes: int
    atol: float
    rtol: float
    min_cosine: float
    min_top1: float
    check_abs: bool
    causal_lm: bool = True                  # decode-ready LMs (prefill/decode + KV cache) are built for this target
    min_generation_agreement: float = 1.0   # LMs: share of parity prompts whose greedy tokens must match PyTorch
    lm_precision: Literal["", "float32", "float16", "dynamic_int8"] = ""  # LMs: precision if not `precision` (when lm_precisions is empty)
    lm_precisions: list[LMPrecision] = dataclasses.field(default_factory=list)  # LMs: recipes measured, preferred first ([] = lm_precision)
    max_perplexity_change: float = 0.02     # LMs: held-out perplexity may differ from PyTorch's float32 by this fraction at most
    browser_parity: bool = False            # also run parity in headless Chromium with LiteRT.js
    firmware: bool = False                  # write model_data.cc/.h and the measured TFLM arena
    app_snippet: Literal["", "kotlin", "swift"] = ""  # loader snippet written next to the artifact
    name: str = ""  # filled from the file name


def profile_dir() -> Path:
    return Path(str(importlib.resources.files("tpu_pipeline.convert"))) / "targets"


def load_profiles(directory: str | Path | None = None) -> Registry[TargetProfile]:
    reg: Registry[TargetProfile] = Registry("target", listed=False)
    d = Path(directory) if directory else profile_dir()
    files = sorted(d.glob("*.toml"))
    if not files:
        raise UserError(f"no target profiles (*.toml) in {d}")
    for path in files:
        prof = config.load(TargetProfile, path)
        reg.add(path.stem, dataclasses.replace(prof, name=path.stem), prof.description, defined_in=str(path))
    return reg


def resolve_targets(spec: str, profiles: Registry[TargetProfile]) -> list[TargetProfile]:
    """`all` or a comma list -> profiles in the canonical order; unknown names list the valid ones."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise UserError("--targets is empty; use all or a comma list of " + ", ".join(profiles.names()))
    if names == ["all"]:
        names = profiles.names()
    order = {n: i for i, n in enumerate(TARGET_ORDER)}
    chosen = [profiles.get(n) for n in dict.fromkeys(names)]
    return sorted(chosen, key=lambda p: (order.get(p.name, len(order)), p.name))
