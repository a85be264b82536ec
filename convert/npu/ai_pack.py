"""Play's on-device AI delivery: every SoC's compiled model in one AI pack, by LiteRT's own exporter
(`ai_edge_litert.aot.ai_pack.export_lib.export`): `<pack>/src/main/assets/model#group_<SoC>/model.tflite`
per SoC, `model#group_other/` holding the model before the compile (phones with no matching SoC),
and `device_targeting_configuration.xml`, which tells Play which phones get which group."""

from __future__ import annotations

import re
from pathlib import Path


def pack_name(model_name: str) -> str:
    """A Gradle module name (letters, digits, underscores; a letter first)."""
    name = re.sub(r"[^0-9A-Za-z_]+", "_", model_name).strip("_") or "model"
    return name if name[0].isalpha() else f"m_{name}"


def write_ai_pack(fallback: bytes, compiled: dict[str, bytes], out_dir: Path, model_name: str,
                  file_name: str = "model") -> list[str]:
    """The AI pack under `out_dir`, the model as `<group>/<file_name>.tflite`; returns its files, relative to
    it. Called again with another file_name (a shape bucket), the same groups take that model too."""
    from ai_edge_litert.aot.ai_pack import export_lib
    from ai_edge_litert.aot.core import aot_types
    from ai_edge_litert.aot.vendors import fallback_backend
    from ai_edge_litert.aot.vendors.qualcomm import qualcomm_backend

    res = aot_types.CompilationResult()
    fb = fallback_backend.FallbackBackend
    res.models_with_backend.append((fb.create({"backend_id": fb.id()}), aot_types.Model.create_from_bytes(fallback)))
    qnn = qualcomm_backend.QualcommBackend
    for soc, model in compiled.items():
        res.models_with_backend.append((qnn.create({"backend_id": qnn.id(), "soc_model": soc}),
                                        aot_types.Model.create_from_bytes(model)))
    export_lib.export(res, out_dir, pack_name(model_name), file_name)
    return sorted(p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*") if p.is_file())
