"""Compatibility of an artifact with a target profile, before parity:
op allowlist, delegate coverage, forbidden tensor types, dynamic dims, size
and (iot) arena. Each violation names the ops and the PyTorch modules.

Fail closed: a check that cannot run is listed in `not_checked`, says so in a
warning, and fails the target when the profile requires what it would have
proven (require_delegate)."""

from __future__ import annotations

import dataclasses
import re

from tpu_pipeline.convert.targets import TargetProfile
from tpu_pipeline.convert.tflite_info import ModelInfo, arena_estimate, module_path, op_module
from tpu_pipeline.convert.tool_output import quiet_native

try:
    from ai_edge_litert import _pywrap_analyzer_wrapper as analyzer
    _ANALYZER_MISSING = None
except ImportError as e:  # a private module of ai-edge-litert: other versions may lack it
    analyzer, _ANALYZER_MISSING = None, f"{type(e).__name__}: {e}"

_BUILTIN = re.compile(r"^[A-Z0-9_]+$")


def _where(info: ModelInfo, ops: list[dict]) -> str:
    seen: dict[str, set] = {}
    for op in ops:
        seen.setdefault(op["op"], set()).add(op_module(info, op) or "the top-level forward")
    return "; ".join(f"{name} (from {', '.join(sorted(mods))})" for name, mods in sorted(seen.items()))


def gpu_analyzer_warnings(model: bytes) -> tuple[list[int], str | None]:
    """Op indices LiteRT's model analyzer flags as GPU-incompatible, or ([], reason) when it cannot run."""
    if analyzer is None:
        return [], f"model analyzer unavailable: {_ANALYZER_MISSING}"
    try:
        with quiet_native():
            text = analyzer.ModelAnalyzer(bytes(model), False, True)
    except Exception as e:  # noqa: BLE001 - any failure means "not checked", which check() reports
        return [], f"model analyzer unavailable: {type(e).__name__}: {str(e).strip()[:200]}"
    flagged = []
    for line in str(text).splitlines():
        if "GPU COMPATIBILITY WARNING" in line:
            m = re.search(r"Op#(\d+)", line)
            if m:
                flagged.append(int(m.group(1)))
    return sorted(set(flagged)), None


@dataclasses.dataclass(kw_only=True)
class Compatibility:
    violations: list[str]
    warnings: list[str]
    not_checked: list[str]      # checks that could not run, with the reason
    ops: list[str]
    delegate: dict              # {"name", "unsupported", "checked", "checked_by"}
    arena_estimate_bytes: int

    @property
    def passed(self) -> bool:
        return not self.violations

    def to_json(self) -> dict:
        return {"passed": self.passed, **dataclasses.asdict(self)}


def check(profile: TargetProfile, model: bytes, info: ModelInfo) -> Compatibility:
    violations, warnings, not_checked = [], [], []
    op_names = sorted({op["op"] for op in info.ops})
    custom = [op for op in info.ops if not _BUILTIN.match(op["op"]) or op["op"] in ("CUSTOM", "DELEGATE")
              or op["op"].startswith("FLEX")]
    if profile.forbid_custom_ops and custom:
        violations.append(f"custom/Flex ops the {profile.name} runtime does not ship: {_where(info, custom)}")
    if profile.allowed_ops:
        allowed = set(profile.allowed_ops)
        bad = [op for op in info.ops if op["op"] not in allowed]
        if bad:
            violations.append(f"ops not in the {profile.name} op resolver: {_where(info, bad)}")
    # checked: None when the profile names no delegate, False when its check could not run
    delegate = {"name": profile.delegate, "unsupported": [], "checked": None, "checked_by": None}
    if profile.delegate != "none":
        delegate["checked"] = True
        if profile.delegate_check == "analyzer":
            flagged, why = gpu_analyzer_warnings(model)
            if why:
                delegate["checked"] = False
                not_checked.append(f"{profile.delegate} delegate coverage: {why}")
                msg = f"{profile.delegate} delegate coverage was not checked ({why})"
                if profile.require_delegate:
                    violations.append(msg + f"; {profile.name} requires the delegate")
                else:
                    warnings.append("WARNING: " + msg)
            else:
                delegate["checked_by"] = "LiteRT model analyzer (gpu_compatibility)"
            bad = [op for op in info.ops if op["index"] in set(flagged)]
        else:
            delegate["checked_by"] = f"{profile.delegate} delegate op list in the target profile"
            bad = [op for op in info.ops if op["op"] not in set(profile.delegate_ops)]
        if bad:
            delegate["unsupported"] = sorted({op["op"] for op in bad})
            msg = f"{len(bad)} of {len(info.ops)} ops fall back from the {profile.delegate} delegate to CPU: {_where(info, bad)}"
            (violations if profile.require_delegate else warnings).append(msg)
    forbid = set(profile.forbid_dtypes)
    bad_t = [(i, t) for i, t in info.tensors.items() if t["dtype"] in forbid]
    if bad_t:
        kinds = sorted({t["dtype"] for _, t in bad_t})
        # every layer, not the first few by name (issue 30: a U-Net's decoder layers hid its encoder's)
        mods = sorted({module_path(t["name"]) or t["name"] for _, t in bad_t})
        violations.append(f"{len(bad_t)} {'/'.join(kinds)} tensors the {profile.name} runtime does not run (in "
                          f"{len(mods)} layers: {', '.join(mods)})")
    dyn = [t for t in info.inputs + info.outputs if any(d < 0 for d in t.shape_signature)]
    if dyn and not profile.allow_dynamic_dims:
        violations.append(f"dynamic dims on {', '.join(t.key for t in dyn)}; {profile.name} needs fixed shapes (pass --input-shape)")
    size = len(model)
    if profile.max_size_bytes and size > profile.max_size_bytes:
        violations.append(f"artifact is {size} bytes, over the {profile.name} budget of {profile.max_size_bytes}")
    arena = arena_estimate(info)
    if profile.max_arena_bytes and arena > profile.max_arena_bytes:
        violations.append(f"arena estimate {arena} bytes is over the {profile.name} budget of {profile.max_arena_bytes}")
    return Compatibility(violations=violations, warnings=warnings, not_checked=not_checked, ops=op_names,
                         delegate=delegate, arena_estimate_bytes=arena)
