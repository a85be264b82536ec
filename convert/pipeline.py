"""`convert(...)`: one PyTorch model -> a checked LiteRT artifact per target.

detect the model's kind (kinds.py) -> refuse options that do not apply to it
-> load -> one float export -> per target, the same steps for every kind:
derive the variant, check compatibility (checks.py), run parity on the
target's runtime, localize a failure, measure latency -> write everything in
a staging folder and move it into place. Targets that fail keep their
artifact only under DIR/<target>/failed/, so a valid-looking
DIR/<target>/model.tflite always passed its checks.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from tpu_pipeline import files
from tpu_pipeline.convert import checks
from tpu_pipeline.convert.firmware import measure_arena, suggested_arena, write_c_array
from tpu_pipeline.convert.kinds import ModelKind, Progress
from tpu_pipeline.convert.lm_kind import CausalLMKind
from tpu_pipeline.convert.loaders import load_object
from tpu_pipeline.convert.module_kind import ModuleKind
from tpu_pipeline.convert.options import FLAGS, ConvertOptions
from tpu_pipeline.convert.report import render_html
from tpu_pipeline.convert.result import Artifact, ConvertResult, TargetResult
from tpu_pipeline.convert.snippets import write_snippet
from tpu_pipeline.convert.targets import TargetProfile, load_profiles, resolve_targets
from tpu_pipeline.convert.tflite_info import inspect_model
from tpu_pipeline.errors import ConversionError, UserError

# Asked in order; the first whose detect() is true takes the model. ModuleKind
# takes anything (its loader says what it cannot read), so it comes last.
MODEL_KINDS: tuple[type[ModelKind], ...] = (CausalLMKind, ModuleKind)


def model_kind(model_path: Path) -> type[ModelKind]:
    return next(k for k in MODEL_KINDS if k.detect(model_path))


def refuse_options(kind: type[ModelKind], o: ConvertOptions) -> None:
    """One line (UserError) for the first option set that has no meaning for `kind`."""
    defaults = ConvertOptions()
    for field, why in kind.refused_options.items():
        if getattr(o, field) != getattr(defaults, field):
            raise UserError(f"{FLAGS.get(field, field)} {why}")


def convert(model: str | Path | torch.nn.Module | torch.export.ExportedProgram, sample_args: Any = None, *,
            targets: str | Sequence[str] = "all", out: str | Path | None = None, calibration: Any = None,
            progress: Progress | None = None, **options: Any) -> ConvertResult:
    """Converts `model` to a checked LiteRT artifact per target.

    model: an nn.Module (with `sample_args`, a tensor or a tuple of tensors, unless it has
    `example_inputs()`), a torch.export ExportedProgram, or a path (what the CLI takes).
    targets: "all", "android,web" or ["android", "web"]. out: output folder (default
    dist/<model name>/). calibration: an .npz path or rows of sample inputs for static int8.
    options: any other ConvertOptions field (samples=, atol=, min_cosine=, latency=, ...).

    Returns a ConvertResult; a failed target does not raise (see `result.passed`,
    `result.exit_code`, `result.raise_for_failures()`). Bad input raises UserError before
    anything is written.

        import torch, tpu_pipeline.convert as tc
        net = torch.nn.Sequential(torch.nn.Linear(16, 4)).eval()
        result = tc.convert(net, (torch.randn(1, 16),), targets="desktop,android", out="dist/net")
        for name, t in result.targets.items():
            print(name, t.passed, t.precision, t.artifact_path, t.metrics["cosine"], t.latency, t.reasons)
    """
    unknown = sorted(set(options) - {f.name for f in dataclasses.fields(ConvertOptions)})
    if unknown:
        valid = ", ".join(f.name for f in dataclasses.fields(ConvertOptions))
        raise UserError(f"convert() got unknown option(s) {', '.join(unknown)}; valid: {valid}")
    o = ConvertOptions(**{**options, "targets": targets if isinstance(targets, str) else ",".join(targets),
                          "out": out if out is not None else options.get("out"),
                          "calib": calibration if calibration is not None else options.get("calib")})
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    if o.samples < 1:
        raise UserError("--samples must be at least 1")
    profiles = resolve_targets(o.targets, load_profiles(o.profile_dir))
    in_memory = isinstance(model, (torch.nn.Module, torch.export.ExportedProgram))
    if in_memory:
        kind: type[ModelKind] = ModuleKind
        name = type(model).__name__ if isinstance(model, torch.nn.Module) else "exported_program"
        label = f"{name} (in memory)"
        set_flags = [FLAGS.get(f, f) for f in _PATH_ONLY if getattr(o, f) != getattr(ConvertOptions(), f)]
        if set_flags:
            raise UserError(f"{set_flags[0]} applies to a model path only; an in-memory model brings its own "
                            "inputs and class")
    else:
        if not isinstance(model, (str, Path)):
            raise UserError(f"model must be an nn.Module, a torch.export.ExportedProgram or a path, "
                            f"not {type(model).__name__}")
        if sample_args is not None:
            raise UserError("sample_args applies to an nn.Module only; a path brings its own inputs "
                            "(input_shapes= for files without them)")
        model_path = Path(model)
        name = model_path.stem if model_path.is_file() else model_path.name
        label = str(model_path)
        kind = model_kind(model_path)
    out_dir = Path(o.out) if o.out else Path("dist") / name
    refuse_options(kind, o)
    skipped = {p.name: why for p in profiles if (why := kind.skip_reason(p))}
    if skipped and o.targets.strip() != "all":
        first = next(iter(skipped))
        raise UserError(f"target {first} does not take {kind.noun}: {skipped[first]}")
    wanted = [p for p in profiles if p.name not in skipped]
    if not wanted:
        raise UserError(f"none of the targets {', '.join(skipped)} takes {kind.noun}: {next(iter(skipped.values()))}")
    torch.manual_seed(o.seed)
    rng = np.random.default_rng(o.seed)
    if in_memory:
        loaded = ModuleKind.from_loaded(load_object(model, sample_args), o, rng)
    else:
        loaded = kind.load(model_path, o, rng, say)

    with tempfile.TemporaryDirectory(prefix="tpu-pipeline-convert-") as work, files.staged_dir(out_dir) as stage:
        work = Path(work)
        t_exp = time.perf_counter()
        float_model = loaded.export_float(work, say)
        export_s = time.perf_counter() - t_exp
        warnings = loaded.prepare(wanted, float_model, rng)
        variants: dict[str, Artifact] = {}
        results = [_target(prof, loaded, float_model, variants, o, work / prof.name, say) for prof in wanted]
        report = {"model": label, "kind": kind.name, **loaded.report_fields(), "warnings": warnings,
                  "export_s": export_s, "versions": _versions(), "targets": {}, "skipped_targets": skipped}
        say("write: artifacts, model.json, report.json, report.html")
        by_name = {p.name: p for p in wanted}
        for r in results:
            _write_target(by_name[r.target], r, loaded, stage, out_dir, say)
            report["targets"][r.target] = r.to_json()
        result = ConvertResult(model=label, kind=kind.name, out=out_dir, targets={r.target: r for r in results},
                               report=report)
        report["wall_s"] = time.perf_counter() - t0
        report["passed"] = result.passed
        report["exit_code"] = result.exit_code
        files.atomic_write_json(stage / "report.json", report)
        files.atomic_write_text(stage / "report.html", render_html(report))
    report["out"] = str(out_dir)
    return result


# ConvertOptions fields that only describe how to read a model file
_PATH_ONLY = ("input_shapes", "model_class", "model_kwargs", "trust_pickle")


def _target(prof: TargetProfile, model: ModelKind, float_model: Artifact, variants: dict[str, Artifact],
            o: ConvertOptions, work: Path, say: Progress) -> TargetResult:
    precision = model.precision(prof)
    r = TargetResult(target=prof.name, quantization=precision, runtime=prof.runtime_note)
    clock = _Clock(r.timings_s)
    try:
        if precision not in variants:
            if precision != "float32":
                say(f"{prof.name}: quantize ({precision}, ai-edge-quantizer)")
            with clock("quantize"):
                variants[precision] = model.variant(float_model, precision)
        art = r.artifact = variants[precision]
        r.info, r.size_bytes = inspect_model(art.model), len(art.model)
        say(f"{prof.name}: compatibility checks")
        with clock("checks"):
            comp = checks.check(prof, art.model, r.info)
        r.compatibility = comp.to_json()
        r.warnings += comp.warnings
        if not comp.passed:
            return r.fail("compatibility", *comp.violations)
        with clock("parity"):
            par = model.parity(prof, art, r.info, o, work, say)
        r.parity, r.passed = par.figures, par.passed
        r.warnings += par.warnings
        r.runtime = par.runtime or r.runtime
        if not r.passed:
            r.fail("parity", *par.reasons)
        if not r.passed and model.localizes:
            say(f"{prof.name}: parity failed; localizing the first diverging layer")
            with clock("localize"):
                loc = model.explain_failure(art, r.info)
            if loc:
                r.parity["first_divergence"] = loc
                r.errors.append(f"first diverging layer: {loc['module']} ({loc['op']}, relative error {loc['rel_err']:.3g})")
        if o.latency:
            say(f"{prof.name}: latency on ai-edge-litert")
            with clock("latency"):
                r.latency_ms = model.latency(art, r.info, work)
    except ConversionError as e:
        r.fail("conversion", str(e))
    return r


def _write_target(prof: TargetProfile, r: TargetResult, model: ModelKind, stage: Path, out: Path,
                  say: Progress) -> None:
    """DIR/<target>/ (or DIR/<target>/failed/): model.tflite, the kind's extra files, model.json,
    and for a passed artifact the profile's app files (firmware, loader snippet)."""
    if r.artifact is None:
        return
    rel = Path(prof.name) / ("" if r.passed else "failed")
    sub = stage / rel
    sub.mkdir(parents=True, exist_ok=True)
    (sub / "model.tflite").write_bytes(r.artifact.model)
    for name, data in r.artifact.extra_files.items():
        (sub / name).write_bytes(data)
    r.artifact_path = str(out / rel / "model.tflite")
    r.sha256 = files.sha256_file(sub / "model.tflite")
    app = r.passed and model.app_files
    if app and prof.firmware:
        _firmware(prof, r, sub, say)
    model_json = model.model_json(r)
    snippet = write_snippet(prof.app_snippet, model_json, sub, out.name) if app else None
    if snippet:
        r.app_snippet = model_json["app_snippet"] = str(out / prof.name / snippet.name)
    files.atomic_write_json(sub / "model.json", model_json)


def _firmware(prof: TargetProfile, r: TargetResult, sub: Path, say: Progress) -> None:
    """Firmware files next to a passed artifact (iot): C array + the arena TFLM needed."""
    say(f"{prof.name}: model_data.cc/.h and the TFLM arena")
    try:
        used = measure_arena(r.artifact.model, max_arena=prof.max_arena_bytes or 64 * 1024 * 1024)
    except ConversionError as e:
        r.warnings.append(f"no firmware files: {e}")
        return
    paths = write_c_array(r.artifact.model, sub, arena_used=used, sha256=r.sha256)
    r.firmware = {"files": [p.name for p in paths], "arena_used_bytes": used,
                  "tensor_arena_size": suggested_arena(used), "measured_on": "tflite-micro interpreter"}


class _Clock:
    """`with clock("stage"):` adds the stage's wall seconds to a dict (the report's timings_s)."""

    def __init__(self, into: dict):
        self.into, self.name, self.t = into, None, 0.0

    def __call__(self, name: str):
        self.name = name
        return self

    def __enter__(self):
        self.t = time.perf_counter()

    def __exit__(self, *exc):
        self.into[self.name] = self.into.get(self.name, 0.0) + time.perf_counter() - self.t


def _versions() -> dict:
    out = {}
    for dist in ("torch", "litert-torch", "ai-edge-litert", "ai-edge-quantizer", "tflite-micro"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out
