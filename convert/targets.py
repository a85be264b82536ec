"""Target profiles: one TOML file per target in convert/targets/, loaded into
`TargetProfile` with the project's one config system (tpu_pipeline.config).

A profile is data, not code: precision, parity runtime, op allowlists, limits
and tolerances. Adding a target means adding a file; its `order` field places
it in reports and `--targets all`.

The LM recipes a profile may list (`lm_precisions`) are LM_RECIPES below,
checked when a profile loads; convert/lm/quant_recipes.py applies them.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
from pathlib import Path
from typing import Literal

from tpu_pipeline import config
from tpu_pipeline.errors import UserError
from tpu_pipeline.registry import Registry

Precision = Literal["float32", "float16", "dynamic_int8", "static_int8", "static_int8_float_io"]


@dataclasses.dataclass(frozen=True)
class LMRecipe:
    """An ai-edge-quantizer recipe applied to an LM's one float32 export (never exported again)."""

    quantizer_recipe: str | None  # a function of ai_edge_quantizer.recipe; None: quantize.py's precision of this name


LM_RECIPES: Registry[LMRecipe] = Registry(
    "LM recipe", "one LM_RECIPES.add in convert/targets.py (name, ai-edge-quantizer recipe, one line); a profile lists "
                 "it in lm_precisions")
# weight_only_*: weights stored as int8/int4 (per channel), dequantized to float before each op,
# float compute. dynamic_int4_block32 is the one blockwise int4 preset ai-edge-quantizer 0.10 has
# (it has no weight-only blockwise preset); litert_lm 0.18.1's CPU refused it on the grpo_math
# policy shape (XNNPACK: an INT4 tensor with a zero scale, "Failed to allocate tensors"), so such a
# candidate fails as a conversion error and it is in no default profile.
LM_RECIPES.add("float32", LMRecipe(None), "the float32 export itself: the reference every recipe is compared with")
LM_RECIPES.add("float16", LMRecipe(None), "float16 weights, float compute (quantize.py, as for any model)")
LM_RECIPES.add("dynamic_int8", LMRecipe(None),
               "int8 weights, activations quantized on the fly (quantize.py, as for any model)")
LM_RECIPES.add("weight_only_int8", LMRecipe("weight_only_wi8_afp32"),
               "int8 weights per channel, float compute: float's quality at ~60% of float16's bytes")
LM_RECIPES.add("weight_only_int4", LMRecipe("weight_only_wi4_afp32"), "int4 weights per channel, float compute")
LM_RECIPES.add("dynamic_int4_block32", LMRecipe("dynamic_wi4b32_afp32"),
               "int4 weights in blocks of 32 (a scale each), activations quantized on the fly")


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
    # per output kind (convert/verdict/output_kinds.py); defaults are desktop's float32 bounds
    max_flip_rate: float = 0.0           # class scores/probabilities: share of rows whose top-1 may flip at all
    max_prob_error: float = 1e-3         # class scores/probabilities: |error| on the probability scale (largest per row, mean over rows)
    max_regression_error: float = 1e-3   # regression: |error| / the reference's spread over the eval rows (largest per row, mean over rows)
    max_regression_mean_error: float = 1e-4  # regression: mean |error| / the reference's spread
    min_nn_agreement: float = 1.0        # embeddings: nearest-neighbour agreement over the eval rows
    min_pixel_agreement: float = 1.0     # dense maps with classes: per-pixel argmax agreement
    max_task_drop: float = 0.005         # with labelled eval data: PyTorch's task score minus the artifact's (metric units)
    min_psnr_db: float = 60.0            # dense maps without classes (depth): PSNR over the reference's range
    min_teacher_forced_top1: float = 0.99  # LMs, quantized bundles: next-token top-1 agreement on held-out text
    max_mean_kl: float = 0.01            # LMs, quantized bundles: mean KL(float || variant) per token, nats
    causal_lm: bool = True                  # decode-ready LMs (prefill/decode + KV cache) are built for this target
    min_generation_agreement: float = 1.0   # LMs: share of parity prompts whose greedy tokens must match PyTorch
    lm_precision: Literal["", "float32", "float16", "dynamic_int8"] = ""  # LMs: precision if not `precision` (when lm_precisions is empty)
    lm_precisions: list[str] = dataclasses.field(default_factory=list)  # LMs: LM_RECIPES measured, preferred first ([] = lm_precision)
    max_perplexity_change: float = 0.02     # LMs: held-out perplexity may differ from PyTorch's float32 by this fraction at most
    browser_parity: bool = False            # also run parity in headless Chromium with LiteRT.js
    # off | try | require: parity also on LiteRT's GPU accelerator (android) / LiteRT.js's WebGPU
    # backend (web, with browser_parity); "require" fails the target when it cannot start
    gpu_accelerator: Literal["off", "try", "require"] = "off"
    webgpu: Literal["off", "try", "require"] = "off"
    firmware: bool = False                  # write model_data.cc/.h and the measured TFLM arena
    # shape buckets (--shapes/--dynamic, convert/shapes.py): a bucket that fails fails the target
    # ("fail"), or the target ships the buckets that pass and names the one left out ("drop")
    bucket_failure: Literal["fail", "drop"] = "fail"
    app_snippet: Literal["", "kotlin", "kotlin-npu", "swift"] = ""  # loader snippet written next to the artifact
    # android-npu (convert/npu/): the variant that passed is compiled per SoC (LiteRT AOT) and each
    # compiled model checked on Qualcomm's HTP simulator; [] = no NPU step
    npu_socs: list[str] = dataclasses.field(default_factory=list)
    min_npu_ops_share: float = 0.0  # refuse when the NPU takes fewer than this share of the ops
    npu_simulator_rows: int = 0     # parity rows run on the HTP simulator per SoC (0: all)
    in_all: bool = True  # part of `--targets all` (false: only when named)
    order: int = 100  # position in reports and `--targets all`, lowest first (ties: by name)
    name: str = ""  # filled from the file name


def profile_dir() -> Path:
    return Path(str(importlib.resources.files("tpu_pipeline.convert"))) / "targets"


def load_profiles(directory: str | Path | None = None) -> Registry[TargetProfile]:
    """Every profile in `directory` (default: the shipped convert/targets/), registered in `order`.
    An unknown key, a wrong type or an lm_precisions name outside LM_RECIPES is a UserError naming
    the file."""
    reg: Registry[TargetProfile] = Registry("target", listed=False)
    d = Path(directory) if directory else profile_dir()
    files = sorted(d.glob("*.toml"))
    if not files:
        raise UserError(f"no target profiles (*.toml) in {d}")
    loaded = []
    for path in files:
        prof = dataclasses.replace(config.load(TargetProfile, path), name=path.stem)
        for recipe in prof.lm_precisions:
            try:
                LM_RECIPES.entry(recipe)
            except UserError as e:
                raise UserError(f"{path}: lm_precisions: {e}") from None
        loaded.append((prof, path))
    for prof, path in sorted(loaded, key=lambda pp: (pp[0].order, pp[0].name)):
        reg.add(prof.name, prof, prof.description, defined_in=str(path))
    return reg


def resolve_targets(spec: str, profiles: Registry[TargetProfile]) -> list[TargetProfile]:
    """`all` or a comma list -> profiles in their `order`; unknown names list the valid ones."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise UserError("--targets is empty; use all or a comma list of " + ", ".join(profiles.names()))
    if names == ["all"]:
        names = [n for n in profiles.names() if profiles.get(n).in_all]
    chosen = [profiles.get(n) for n in dict.fromkeys(names)]
    return sorted(chosen, key=lambda p: (p.order, p.name))
