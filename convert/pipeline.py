"""`convert(...)`: one PyTorch model -> a checked LiteRT artifact per target.

detect the model's kind (kinds.py) -> refuse options that do not apply to it
-> load -> one float export -> the float32 gate: that export's own parity,
judged as desktop (every variant derives from it, so a mismatch fails every
target as a conversion error) -> per target, the same steps for every kind:
for each precision the profile allows (kind.candidates), derive the variant,
check compatibility (checks.py), run parity on the target's runtime, measure
latency; ship the candidate that passes parity and the checks, then is
fastest; localize a failure -> write everything in a staging folder and move
it into place. Targets that fail keep their artifact only under
DIR/<target>/failed/, so a valid-looking DIR/<target>/model.tflite always
passed its checks.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import importlib.metadata
import os
import tempfile
import time
from html import escape
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from tpu_pipeline import files
from tpu_pipeline.convert import shapes
from tpu_pipeline.convert.iot.firmware import measure_arena, suggested_arena, write_c_array
from tpu_pipeline.convert.hf import kind as _hf_kind  # noqa: F401 - registers HFTaskKind (see model_kind)
from tpu_pipeline.convert.kinds import ModelKind, Progress, detection_order
from tpu_pipeline.convert.lm import kind as _lm_kind  # noqa: F401 - registers CausalLMKind (see model_kind)
from tpu_pipeline.convert.module.kind import ModuleKind
from tpu_pipeline.convert.module.loaders import load_model, load_object
from tpu_pipeline.convert.npu import check as npu_check
from tpu_pipeline.convert.npu.ai_pack import write_ai_pack
from tpu_pipeline.convert.npu.compile import soc_model_json
from tpu_pipeline.convert.options import FLAGS, ConvertOptions
from tpu_pipeline.convert.precision.quantize import CALIBRATED, DEFAULT_RANGES, RANGE_ESTIMATORS
from tpu_pipeline.convert.report import render_html
from tpu_pipeline.convert.result import Artifact, ConvertResult, Parity, TargetResult
from tpu_pipeline.convert.runtimes import browser, overlap
from tpu_pipeline.convert.runtimes.delegation import splits_more, xnnpack_plan
from tpu_pipeline.convert.runtimes.litert import gpu_worker_ahead
from tpu_pipeline.convert.snippets import write_snippet
from tpu_pipeline.convert.targets import TargetProfile, load_profiles, resolve_targets
from tpu_pipeline.convert.tflite_info import inspect_model, module_path
from tpu_pipeline.convert.tool_output import first_line
from tpu_pipeline.convert.verdict import checks, int8_ranges, layer_errors, output_kinds, task_score
from tpu_pipeline.errors import ConversionError, PipelineError, UserError
from tpu_pipeline.library_noise import quieted
from tpu_pipeline.progress import reporter

def model_kind(model_path: Path) -> type[ModelKind]:
    """The first registered kind (kinds.MODEL_KINDS, in detection_order) whose detect() holds.
    This module is the composition point: it imports every kind's module, which registers it;
    ModuleKind takes anything (its loader says what it cannot read), so it is asked last."""
    return next(k for k in detection_order() if k.detect(model_path))


def refuse_options(kind: type[ModelKind], o: ConvertOptions) -> None:
    """One line (UserError) for the first option set that has no meaning for `kind`."""
    defaults = ConvertOptions()
    for field, why in kind.refused_options.items():
        if getattr(o, field) != getattr(defaults, field):
            raise UserError(f"{FLAGS.get(field, field)} {why}")


def typed_errors(fn):
    """The Python API raises only the project's typed errors (tpu_pipeline.errors): an exception
    of any other type escaping a conversion stage is a bug, reported as a ConversionError that
    names it (exit 3, its traceback chained for --debug) instead of a bare one (exit 1)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PipelineError:
            raise
        except Exception as e:  # noqa: BLE001 - the backstop; each stage turns its own failures into reasons
            raise ConversionError(f"internal error: {_why(e)} (rerun with --debug for the traceback)") from e

    return wrapper


def _why(e: BaseException) -> str:
    return f"{type(e).__name__}: {first_line(e)}"


@quieted()
@typed_errors
def convert(model: str | Path | torch.nn.Module | torch.export.ExportedProgram, sample_args: Any = None, *,
            targets: str | Sequence[str] = "all", out: str | Path | None = None, calibration: Any = None,
            progress: Progress | bool | None = None, **options: Any) -> ConvertResult:
    """Converts `model` to a checked LiteRT artifact per target.

    model: an nn.Module (with `sample_args`, a tensor or a tuple of tensors, unless it has
    `example_inputs()`), a torch.export ExportedProgram, or a path (what the CLI takes).
    targets: "all", "android,web" or ["android", "web"]. out: output folder (default
    dist/<model name>/). calibration: an .npz path or rows of sample inputs for static int8.
    progress: None logs a line a step on the `tpu_pipeline.convert` logger (printed to stderr
    unless logging is set up; tpu_pipeline/progress.py), False prints nothing, a callable gets
    each line. The libraries' own chatter is kept out while it runs (tpu_pipeline/library_noise.py).
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
    say = reporter(progress, __name__.rpartition(".")[0])
    t0 = time.perf_counter()
    if o.samples is not None and o.samples < 1:
        raise UserError("--samples must be at least 1")
    o = dataclasses.replace(o, output_kinds=output_kinds.parse(o.output_kinds))
    profiles = resolve_targets(o.targets, load_profiles(o.profile_dir))
    for p in profiles:
        if p.npu_socs:  # a SoC that cannot compile here, no [npu] extra: one line before anything is read
            npu_check.preflight(p.name, p.npu_socs)
    o = dataclasses.replace(o, max_task_drop=task_score.parse_max_drop(o.max_task_drop, [p.name for p in profiles]))
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
    _check_out(out_dir)
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
    with contextlib.ExitStack() as children:
        if any(p.browser_parity for p in wanted):
            # Chromium starts now and loads LiteRT.js (and its WebGPU device) while the model loads and
            # exports on this thread; every browser run of this conversion then uses it (browser.session)
            children.enter_context(browser.session(webgpu=any(p.webgpu != "off" for p in wanted if p.browser_parity)))
        if issubclass(kind, ModuleKind) and any(p.gpu_accelerator != "off" and p.runtime != "tflite-micro"
                                                for p in wanted):
            children.enter_context(gpu_worker_ahead())  # the GPU worker's imports, meanwhile, on the idle core
        return _convert(kind, model, sample_args, o, label, model_path if not in_memory else None, out_dir, wanted,
                        skipped, rng, say, t0)


def _convert(kind: type[ModelKind], model, sample_args, o: ConvertOptions, label: str, model_path: Path | None,
             out_dir: Path, wanted: list[TargetProfile], skipped: dict, rng: np.random.Generator, say: Progress,
             t0: float) -> ConvertResult:
    if shapes.wanted(o) or (model_path is not None and issubclass(kind, ModuleKind)
                            and shapes.in_manifest(model_path)):  # a model.pt that lists its shape buckets
        return _convert_buckets(model, sample_args, o, label, model_path, out_dir, wanted, skipped, rng, say, t0)
    if o.pad:
        raise UserError("--pad says how a row fills a shape bucket: give the buckets with --shapes or --dynamic")
    if model_path is None:
        loaded = ModuleKind.from_loaded(load_object(model, sample_args), o, rng)
    else:
        loaded = kind.load(model_path, o, rng, say)

    with tempfile.TemporaryDirectory(prefix="tpu-pipeline-convert-") as work, files.staged_dir(out_dir) as stage:
        work = Path(work)
        t_exp = time.perf_counter()
        float_model = loaded.export_float(work, say)
        export_s = time.perf_counter() - t_exp
        warnings = loaded.prepare(wanted, float_model, rng)
        run = _Run(model=loaded, float_model=float_model, o=o, work=work, say=say)
        gate_prof = _gate_profile(wanted, load_profiles(o.profile_dir))
        gate = _float_gate(run, gate_prof)
        results = _targets(wanted, run, gate)
        report = {"model": label, "kind": kind.name, **loaded.report_fields(), "warnings": warnings,
                  "export_s": export_s, "versions": _versions(), "float_export": _gate_json(gate_prof, gate),
                  "targets": {}, "skipped_targets": skipped}
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
        html = _html(report)
        files.atomic_write_json(stage / "report.json", report)
        files.atomic_write_text(stage / "report.html", html)
    report["out"] = str(out_dir)
    return result


def _convert_buckets(model, sample_args, o: ConvertOptions, label: str, model_path: Path | None, out_dir: Path,
                     wanted: list[TargetProfile], skipped: dict, rng: np.random.Generator, say: Progress,
                     t0: float) -> ConvertResult:
    """--shapes/--dynamic (shapes.py): the per-target steps below, once per shape bucket."""
    if model_path is not None and not issubclass(model_kind(model_path), ModuleKind):
        raise UserError("--shapes/--dynamic apply to nn.Module models (a causal-LM folder is exported decode-ready "
                        "with its own prefill and decode signatures)")
    m = load_object(model, sample_args) if model_path is None else load_model(
        model_path, input_shapes=list(o.input_shapes), model_class=o.model_class, model_kwargs=o.model_kwargs,
        trust_pickle=o.trust_pickle)
    gate_prof = _gate_profile(wanted, load_profiles(o.profile_dir))

    def run_bucket(loaded: ModuleKind, profiles: list[TargetProfile], work: Path):
        work.mkdir(parents=True, exist_ok=True)
        t_exp = time.perf_counter()
        float_model = loaded.export_float(work, say)
        export_s = time.perf_counter() - t_exp
        warned = loaded.prepare(profiles, float_model, rng)
        run = _Run(model=loaded, float_model=float_model, o=o, work=work, say=say)
        gate = _float_gate(run, gate_prof)
        return (_targets(profiles, run, gate), lambda again: _targets(again, run, gate), export_s, warned,
                _gate_json(gate_prof, gate))

    return shapes.convert_buckets(m, o, label, out_dir, wanted, skipped, rng, say, t0, run_bucket=run_bucket,
                                  html=_html, versions=_versions)


def _check_out(out_dir: Path) -> None:
    """Bad --out, before anything is read or written: an existing file (staging would move it
    aside), or a place no folder can be made (its nearest existing parent is a file or read-only)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out {out_dir} is a file, not a folder")
    parent = out_dir.parent.absolute()
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"--out {out_dir}: cannot create it ({parent} is not a writable folder)")


def _html(report: dict) -> str:
    """report.html; a rendering bug leaves a page that says so (report.json holds everything)."""
    try:
        return render_html(report)
    except Exception as e:  # noqa: BLE001 - the report is written either way
        report["warnings"].append(f"report.html could not be rendered ({_why(e)}); report.json holds the report")
        return (f"<!doctype html><meta charset=utf-8><title>tpu-pipeline convert</title><p>report.html could not be "
                f"rendered ({escape(_why(e))}); see report.json beside it.</p>")


def _targets(wanted: list[TargetProfile], run: _Run, gate: Parity | None) -> list[TargetResult]:
    """Every target's result, in `wanted` order. Each target runs in its own thread, taking turns on
    this process's work (overlap.Turns): while one waits on a child process (Chromium, the GPU
    accelerator, TFLM), the next does its own work on the other core. Targets whose checks wait
    longest on children (the browser, then the GPU accelerator) take their turns first, so their
    children start early; the rest follow in report order. A target that raises (UserError) stops
    the others at their next turn; every thread has ended when this returns or raises."""
    if len(wanted) == 1:
        return [_guarded_target(wanted[0], run, gate)]
    first = sorted(range(len(wanted)), key=lambda i: (not wanted[i].browser_parity,
                                                      wanted[i].gpu_accelerator == "off", i))
    rank = {i: r for r, i in enumerate(first)}
    turns = overlap.Turns(len(wanted))
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(wanted), thread_name_prefix="tpp-target") as pool:
        futures = [pool.submit(turns.run, rank[i], _guarded_target, prof, run, gate) for i, prof in enumerate(wanted)]
        try:
            concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
            failed = next((f for f in futures if f.done() and f.exception() is not None), None)
            if failed is not None:
                raise failed.exception()
            return [f.result() for f in futures]
        except BaseException:
            turns.cancel()  # the others start no more work; the pool waits for them to end,
            browser.close_sessions()  # and one waiting on the browser is answered now, not at its timeout
            raise


def _guarded_target(prof: TargetProfile, run: _Run, gate: Parity | None) -> TargetResult:
    """_target, with any exception it lets out (a runtime, check or localization that crashed)
    as this target's failure and its reason: the other targets still run and the report is written."""
    try:
        return _target(prof, run, gate)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001
        r = TargetResult(target=prof.name, quantization=run.model.candidates(prof)[0], runtime=prof.runtime_note)
        return r.fail("conversion", f"internal error while checking {prof.name}: {_why(e)}")


def _explain(run: _Run, art: Artifact, info, errors: list[str]) -> dict | None:
    """The first diverging layer, or None; a localization that crashes adds its reason to `errors`
    (the verdict stands: localization explains a failure, it never decides one)."""
    try:
        return run.model.explain_failure(art, info)
    except Exception as e:  # noqa: BLE001
        errors.append(f"localization failed: {_why(e)}")
        return None


# ConvertOptions fields that only describe how to read a model file
_PATH_ONLY = ("input_shapes", "model_class", "model_kwargs", "trust_pickle")


@dataclasses.dataclass
class _Run:
    """One conversion's shared state: each variant is made once, each (profile, precision)
    judged once and each precision timed once, however many targets ask for it."""

    model: ModelKind
    float_model: Artifact
    o: ConvertOptions
    work: Path
    say: Progress
    variants: dict[str, Artifact] = dataclasses.field(default_factory=dict)
    parities: dict[tuple[str, bool, str], Parity] = dataclasses.field(default_factory=dict)
    latencies: dict[str, dict] = dataclasses.field(default_factory=dict)
    gate: str | None = None  # the profile the float32 export was judged as; its target inherits the gate's timings
    gate_timings: dict[str, float] = dataclasses.field(default_factory=dict)
    ranges: dict[str, dict] = dataclasses.field(default_factory=dict)  # variant key -> int8_ranges.clipping
    plans: dict[str, dict] = dataclasses.field(default_factory=dict)  # variant key -> delegation.xnnpack_plan

    def xnnpack(self, key: str, art: Artifact) -> dict:
        if key not in self.plans:
            self.plans[key] = xnnpack_plan(art.model)
        return self.plans[key]

    def variant(self, precision: str, clock: _Clock) -> Artifact:
        if precision not in self.variants:
            if precision != "float32":
                self.say(f"quantize ({precision}, ai-edge-quantizer)")
            with clock("quantize"):
                self.variants[precision] = self.model.variant(self.float_model, precision)
        return self.variants[precision]

    def parity(self, prof: TargetProfile, precision: str, art: Artifact, info, clock: _Clock) -> Parity:
        key = (prof.name, prof.browser_parity, prof.gpu_accelerator, precision)
        if key not in self.parities:
            with clock("parity"):
                self.parities[key] = self.model.parity(prof, art, info, self.o, self.work / prof.name / precision,
                                                       self.say)
        return self.parities[key]

    def latency(self, precision: str, art: Artifact, info, clock: _Clock) -> dict:
        if precision not in self.latencies:
            label = precision.split("+")[0] + (" (layers kept in float32)" if "+float:" in precision else "")
            self.say(f"latency of the {label} artifact on ai-edge-litert")
            with clock("latency"):
                self.latencies[precision] = self.model.latency(art, info, self.work)
        return self.latencies[precision]


def _gate_profile(wanted: list[TargetProfile], profiles) -> TargetProfile | None:
    """The profile the float32 export is judged by before any variant ships: desktop's (the
    float32 target), whether or not desktop was asked for."""
    for p in wanted:
        if p.name == "desktop":
            return p
    return profiles.get("desktop") if "desktop" in profiles.names() else None


def _float_gate(run: _Run, prof: TargetProfile | None) -> Parity | None:
    """Parity of the one float32 export against PyTorch: every variant derives from it, so if it
    fails, the converter (not precision) is wrong and every target fails as a conversion error."""
    if prof is None:
        return None
    run.say(f"float32 export: parity on {prof.runtime} (every target derives from it)")
    run.gate = prof.name
    clock = _Clock(run.gate_timings)
    art = run.variant("float32", clock)
    try:
        info = inspect_model(art.model)
        gate = run.parity(prof, "float32", art, info, clock)
    except UserError:
        raise
    except Exception:  # noqa: BLE001 - the float artifact does not run (ConversionError) or its runtime crashed:
        return None    # each target's own attempt reports why
    if not gate.passed and run.model.localizes:
        run.say("float32 export: parity failed; localizing the first diverging layer")
        with clock("localize"):
            loc = _explain(run, art, info, failed := [])
        if failed:
            gate.figures["localize_failed"] = failed[0]
        if loc:
            gate.figures["first_divergence"] = loc
    return gate


def _gate_json(prof: TargetProfile | None, gate: Parity | None) -> dict | None:
    if gate is None:
        return None
    keep = ("passed", "reasons", "decided_by", "cosine", "max_abs", "diagnosis", "first_divergence",
            "localize_failed")
    return {"judged_as": prof.name, **{k: gate.figures[k] for k in keep if k in gate.figures}}


def _target(prof: TargetProfile, run: _Run, gate: Parity | None) -> TargetResult:
    """Every candidate precision the profile allows, then the winner: passes parity and the
    target's checks (size budget, ops, arena) first, then the lowest latency (a candidate
    must be PREFER_MARGIN faster to beat one listed before it)."""
    if gate is not None and not gate.passed:
        return _gated(prof, run, gate)
    precisions = run.model.candidates(prof)
    # The browser run (Chromium) and the GPU accelerator (shaders compiled on SwiftShader, seconds)
    # are the slow parts of parity: candidates are ranked on XNNPACK first, and only the ranked
    # winner must also pass in the browser and on the accelerator.
    slow = prof.browser_parity or prof.gpu_accelerator != "off"
    quick = (dataclasses.replace(prof, browser_parity=False, gpu_accelerator="off") if slow and len(precisions) > 1
             else prof)
    tries = [_attempt(quick, precision, run) for precision in precisions]
    winner, why = _choose(tries)
    while quick is not prof and winner.passed:
        full = _attempt(prof, winner.quantization, run)
        tries[tries.index(winner)] = full
        if full.passed:
            winner = full
            break
        winner, why = _choose(tries)
    if len(tries) > 1:
        winner.candidates = [{"precision": t.quantization, "passed": t.passed, "size_bytes": t.size_bytes,
                              "latency_ms": (t.latency_ms or {}).get("artifact"), "failure": t.failure,
                              "cosine": (t.parity or {}).get("cosine"), "errors": t.errors[:1],
                              **(t.parity or {}).get("lm_recipe", {}),
                              "xnnpack_partitions": (t.xnnpack or {}).get("partitions"),
                              "ops_outside_xnnpack": (t.xnnpack or {}).get("left"),
                              "chosen": t is winner} for t in tries]
        winner.chosen_because = why
        run.say(f"{prof.name}: {winner.quantization} ({why})")
    if not winner.passed and winner.failure == "parity":
        _diagnose(winner, run)
        p = winner.parity or {}
        if (p.get("int8_ranges") or {}).get("clipped") and run.o.refine_rounds > 0:
            winner = _repair_ranges(prof, winner, run)
        elif (p.get("int8_ranges") or {}).get("clipped"):
            winner.errors.append(int8_ranges.summary(p["int8_ranges"]) + " (no repair tried: --refine-rounds 0)")
        precision_loss = str(p.get("diagnosis", "")).startswith("precision loss") and not (
            p.get("float16_activations") or {}).get("first_nonfinite")  # inf in float16: no layer choice fixes it
        full_integer = "float32" in prof.forbid_dtypes  # a layer kept in float32 cannot pass its checks
        if not winner.passed and run.model.refines and precision_loss and run.o.refine_rounds > 0 and not full_integer:
            winner = _refine(prof, winner, run)
    elif winner.passed and int8_ranges.material((winner.parity or {}).get("int8_ranges")) and run.o.refine_rounds > 0:
        winner = _repair_ranges(prof, winner, run)
    if prof.npu_socs and winner.passed and isinstance(run.model, ModuleKind):
        winner = _npu(prof, winner, tries, run)
    if isinstance(run.model, ModuleKind):  # app_io: TFLite metadata, then the MediaPipe task on the eval rows
        winner = run.model.app_ready(prof, winner)
    return winner


def _npu(prof: TargetProfile, winner: TargetResult, tries: list[TargetResult], run: _Run) -> TargetResult:
    """android-npu: the variant that passed on XNNPACK, compiled per SoC and checked on the HTP
    simulator (convert/npu/check.py); when it fails there, the next candidate that passed on
    XNNPACK is tried (float16 after static int8), else the winner fails with the NPU's reasons."""
    for t in [winner] + [t for t in tries if t.passed and t is not winner]:
        judge, torch_judge, cpu_got = run.model.judge_elsewhere(prof, run.o, t.artifact, t.info)
        with _Clock(t.timings_s)("npu"):
            res = npu_check.check(prof.name, prof.npu_socs, prof.min_npu_ops_share, prof.npu_simulator_rows,
                                  t.artifact.model, run.model.samples, judge, cpu_got, run.say, torch_judge)
        t.npu, t.npu_models = res.figures, res.models
        if res.passed:
            if t is not winner:
                t.candidates = [{**c, "chosen": c["precision"] == t.quantization, **(
                    {"passed": False, "failure": winner.failure, "errors": winner.errors[:1]}
                    if c["precision"] == winner.quantization else {})} for c in winner.candidates or []] or None
                t.chosen_because = (f"{winner.quantization} passed on XNNPACK but failed on the NPU "
                                    f"({(winner.errors or ['?'])[0]}); {t.quantization} passes on both")
                t.npu["failed_first"] = {"precision": winner.quantization, "reasons": winner.errors[:4],
                                         "socs": winner.npu["socs"]}
                t.warnings.append(t.chosen_because)
            return t
        t.fail(res.failure or "conversion", *res.reasons)
    return winner


def _most_harmful_layer(r: TargetResult, kept: set[str]) -> tuple[str, str] | None:
    """(module, op scope) of the layer that adds the most error (the largest rise of relative error
    over the layer before it, in execution order), not yet kept in float. Quantization error
    accumulates over layers, so the first layer past a threshold is often not the one to blame."""
    loc = (r.parity or {}).get("first_divergence")
    if not loc or r.info is None:
        return None
    rows, prev, best = sorted(loc.get("layers") or [loc], key=lambda x: x["op_index"]), 0.0, None
    for row in rows:
        rise, prev = row["rel_err"] - prev, row["rel_err"]
        scope = ";".join(r.info.tensors[i]["name"] for i in r.info.ops[row["op_index"]]["outputs"])
        if scope not in kept and (best is None or rise > best[0]):
            best = (rise, row["module"], scope)
    return (best[1], best[2]) if best and best[0] > 0 else None


def _refine(prof: TargetProfile, failed: TargetResult, run: _Run) -> TargetResult:
    """Accuracy-aware quantization: keep the first diverging layer of the failed variant in
    float32, rebuild the variant from the float export, judge it again; repeat until it passes
    or run.o.refine_rounds run out. Returns the passing variant, else `failed` with the rounds
    recorded."""
    kept: list[tuple[str, str]] = []  # (module path, op scope)
    cur, rounds = failed, []
    for _ in range(run.o.refine_rounds):
        pick = _most_harmful_layer(cur, {s for _, s in kept})
        if pick is None:
            break  # nothing left to keep in float: the loss comes from elsewhere
        kept.append(pick)
        run.say(f"{prof.name}: {failed.quantization} missed its bound; keeping {pick[0]} in float32")
        cur = _attempt(prof, failed.quantization, run, tuple(s for _, s in kept))
        rounds.append({"kept": pick[0], "passed": cur.passed, "cosine": (cur.parity or {}).get("cosine_mean"),
                       "size_bytes": cur.size_bytes})
        if not cur.passed and cur.failure == "parity" and run.model.localizes and cur.artifact is not None:
            loc = _explain(run, cur.artifact, cur.info, cur.warnings)
            if loc:
                cur.parity["first_divergence"] = loc
        if cur.passed or cur.failure != "parity":
            break
    if not rounds:
        return failed
    summary = {"layers": [m for m, _ in kept], "rounds": rounds, "passed": cur.passed,
               "bytes_added": (cur.size_bytes or 0) - (failed.size_bytes or 0),
               "latency_ms_before": failed.latency, "latency_ms_after": cur.latency}
    if cur.passed:
        cur.kept_float = summary
        loc = (failed.parity or {}).get("first_divergence")
        overlay = layer_errors.overlay(loc, failed.info) if loc and failed.info else None
        if overlay:  # the layers that lost precision, measured before they were kept in float32
            cur.layer_errors = {"overlay": overlay, "measured_on": f"{failed.quantization}, before keeping "
                                f"{', '.join(summary['layers'])} in float32"}
        cur.candidates, cur.chosen_because = failed.candidates, (
            f"{failed.quantization} missed its bound; passes with {', '.join(summary['layers'])} kept in float32 "
            f"(+{summary['bytes_added']} bytes)")
        cur.warnings.append(cur.chosen_because)
        return cur
    failed.kept_float = summary
    failed.errors.append(f"kept {', '.join(summary['layers'])} in float32 over {len(rounds)} rounds; still fails")
    return failed


PREFER_MARGIN = 0.10  # latency noise on shared cores: a later-listed precision must be 10% faster to win


def _choose(tries: list[TargetResult]) -> tuple[TargetResult, str]:
    ok = [t for t in tries if t.passed]
    if not ok:
        return tries[0], "no candidate passed; the profile's first precision is reported"
    best = ok[0]
    for t in ok[1:]:
        if t.latency is not None and best.latency is not None and t.latency < best.latency * (1 - PREFER_MARGIN):
            best = t
    others = [t for t in tries if t is not best]
    if not others:
        return best, "the only candidate"
    parts = []
    for t in others:
        if not t.passed:
            parts.append(f"{t.quantization} failed {t.failure}")
        elif t.latency is None or best.latency is None:
            parts.append(f"{t.quantization} passed too; listed later (no latency measured)")
        elif t.latency < best.latency:
            parts.append(f"{t.quantization} passed too and is {1 - t.latency / best.latency:.0%} faster "
                         f"({t.latency:.3g} vs {best.latency:.3g} ms), under the {PREFER_MARGIN:.0%} needed to beat "
                         "a precision listed before it")
        else:
            parts.append(f"{t.quantization} passed too but is slower ({t.latency:.3g} vs {best.latency:.3g} ms)")
    return best, "passed parity and the target's checks; " + "; ".join(parts)


def _gated(prof: TargetProfile, run: _Run, gate: Parity) -> TargetResult:
    why = gate.reasons[0] if gate.reasons else "parity failed"
    loc = gate.figures.get("first_divergence")
    where = f"; first diverging layer: {loc['module']}" if loc else ""
    msg = f"conversion error: the float32 export does not match PyTorch ({why}{where}); every target derives from it"
    precision = run.model.candidates(prof)[0]
    if (prof.name, prof.browser_parity, prof.gpu_accelerator, "float32") in run.parities and precision == "float32":
        r = _attempt(prof, "float32", run)  # the gate's own target: its artifact and figures go under failed/
        r.errors.insert(0, msg)
        _diagnose(r, run)
        return r
    r = TargetResult(target=prof.name, quantization=precision, runtime=prof.runtime_note)
    return r.fail("parity", msg)


def _attempt(prof: TargetProfile, precision: str, run: _Run, keep_float: tuple[str, ...] = (),
             range_estimator: str = DEFAULT_RANGES) -> TargetResult:
    """One candidate precision on one target: variant, checks, parity, latency. keep_float: op
    scopes left in float32, range_estimator: how static int8 sets activation ranges (both for the
    accuracy-aware rounds); the variant is cached under its own key."""
    r = TargetResult(target=prof.name, quantization=precision, runtime=prof.runtime_note)
    if precision == "float32" and prof.name == run.gate:
        r.timings_s.update(run.gate_timings)  # its variant and parity ran as the float32 gate
    clock = _Clock(r.timings_s)
    key = precision + (f"+float:{'|'.join(keep_float)}" if keep_float else "") + (
        f"+ranges:{range_estimator}" if range_estimator != DEFAULT_RANGES else "")
    try:
        if key != precision and key not in run.variants:
            with clock("quantize"):
                # only ModuleKind calibrates (LM recipes never reach here: _repair_ranges asks for it)
                run.variants[key] = run.model.variant_keeping_float(run.float_model, precision, list(keep_float),
                                                                    range_estimator)
        art = r.artifact = run.variant(key, clock)
        r.info, r.size_bytes = inspect_model(art.model), len(art.model)
        if prof.runtime == "ai-edge-litert" and isinstance(run.model, ModuleKind):
            _xnnpack(r, key, art, run)
        run.say(f"{prof.name}: compatibility checks ({precision})")
        with clock("checks"):
            comp = checks.check(prof, art.model, r.info)
        r.compatibility = comp.to_json()
        r.warnings += comp.warnings
        if not comp.passed:
            return r.fail("compatibility", *comp.violations)
        par = run.parity(prof, key, art, r.info, clock)
        r.parity, r.passed = dict(par.figures), par.passed
        r.warnings += par.warnings
        r.runtime = par.runtime or r.runtime
        if not r.passed:
            r.fail("parity", *par.reasons)
        if precision in CALIBRATED and isinstance(run.model, ModuleKind):
            with clock("int8_ranges"):
                r.parity["int8_ranges"] = _clipping(run, key, art)
        if run.o.latency:
            r.latency_ms = run.latency(key, art, r.info, clock)
            _why_slower(r)
    except ConversionError as e:
        r.fail("conversion", str(e))
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - a runtime or check that crashed fails this candidate, with its reason
        r.fail("conversion", f"{precision} on {prof.name}: {_why(e)} (in stage {clock.name or 'variant'})")
    return r


def _xnnpack(r: TargetResult, key: str, art: Artifact, run: _Run) -> None:
    """The phone's CPU plan of this variant (XNNPACK's partitions, the ops left to other kernels) on
    r, with a warning when it splits the graph further than the float32 export; a plan that cannot be
    read says why (it never decides a verdict)."""
    try:
        plan = run.xnnpack(key, art)
        base = run.xnnpack("float32", run.float_model)
    except Exception as e:  # noqa: BLE001 - the interpreter refusing the artifact: parity reports that
        r.xnnpack = {"skipped": f"the XNNPACK plan could not be read: {_why(e)}"}
        return
    r.xnnpack = {k: v for k, v in plan.items() if k != "left_scopes"}
    if key.split("+")[0] != "float32" and (split := splits_more(plan, base)):
        r.xnnpack["splits_more_than_float32"] = split
        r.warnings.append(f"{r.quantization}: {split}")


def _why_slower(r: TargetResult) -> None:
    """An artifact slower than PyTorch eager names the ops XNNPACK left to TFLite's other kernels,
    where the time usually goes (a fused LSTM's sequence kernel: docs/BENCHMARKS.md, recurrent layers)."""
    lat, left = r.latency_ms or {}, (r.xnnpack or {}).get("left")
    if left and lat.get("speedup_vs_torch") and lat["speedup_vs_torch"] < 1:
        lat["slower_than_torch"] = (f"{1 / lat['speedup_vs_torch']:.2f}x PyTorch eager's time; ops outside XNNPACK, "
                                    "on TFLite's builtin kernels: " + ", ".join(f"{op} x{n}" for op, n in left.items()))


def _clipping(run: _Run, key: str, art: Artifact) -> dict:
    """int8_ranges.clipping of this variant on the parity rows, once per variant; a check that cannot
    run says why (it never decides a verdict: parity does)."""
    if key not in run.ranges:
        try:
            run.ranges[key] = int8_ranges.clipping(run.float_model.model, art.model, run.model.samples)
        except Exception as e:  # noqa: BLE001 - a runtime refusing preserve_all, an odd tensor type
            run.ranges[key] = {"skipped": f"the int8 range check could not run: {_why(e)}"}
    return run.ranges[key]


def _repair_ranges(prof: TargetProfile, base: TargetResult, run: _Run) -> TargetResult:
    """Static int8 whose int8 ranges clip the float model (int8_ranges.py), repaired in the
    accuracy-aware rounds: each repair is built from the float export and judged like any
    candidate (the task with labels, else parity), its cost in bytes and latency recorded.
    `base` failed: the cheapest repair that passes ships (fewest bytes added, then latency); none
    passes: `base`, refused with the clipping named in its reasons. `base` passed with an
    output clipped (int8_ranges.material): only repairs that add no bytes are tried, and one ships
    if it passes and clips that output less (a verdict without labels shipped a GRU 4.7 points of
    accuracy below PyTorch at top-1 agreement 0.953, its logits clipped on 24% of values)."""
    clip = base.parity["int8_ranges"]
    rows = len(run.model.calib or [])
    tried: list[dict] = [{"repair": "more calibration rows", "tried": False,
                          "why": f"all {rows} calibration rows are used; parity rows are never calibration rows"}]
    attempts = [("min/max ranges", {"range_estimator": "min_max"})]
    if base.passed:
        tried.append({"repair": "keep the clipped layers in float32", "tried": False,
                      "why": "the variant passes; float layers would only add bytes"})
    elif "float32" in prof.forbid_dtypes:
        tried.append({"repair": "keep the clipped layers in float32", "tried": False,
                      "why": f"{prof.name} is full-integer: its profile forbids float32 tensors"})
    else:
        scopes = _scopes(base, [c["tensor"] for c in clip["clipped"] if c["role"] != "input"])
        if scopes:
            attempts.append((f"keep the clipped layers in float32 ({', '.join(m for m, _ in scopes)})",
                             {"keep_float": tuple(s for _, s in scopes)}))
    passing = []
    for label, kw in attempts:
        run.say(f"{prof.name}: {base.quantization} clips int8 ranges; trying {label}")
        r = _attempt(prof, base.quantization, run, **kw)
        after = (r.parity or {}).get("int8_ranges") or {}
        rec = {"repair": label, "tried": True, **({"what": RANGE_ESTIMATORS[kw["range_estimator"]]}
                                                  if "range_estimator" in kw else {}), "passed": r.passed,
               "failure": r.failure, "size_bytes": r.size_bytes,
               "bytes_added": (r.size_bytes or 0) - (base.size_bytes or 0), "latency_ms": r.latency,
               "latency_ms_before": base.latency, "cosine_mean": (r.parity or {}).get("cosine_mean"),
               "task": ((r.parity or {}).get("task") or {}).get("score"),
               "clipped_after": len(after.get("clipped", [])), "errors": r.errors[:1]}
        tried.append(rec)
        if r.passed and (not base.passed or (rec["bytes_added"] <= 0 and
                                             int8_ranges.material(after) < int8_ranges.material(clip))):
            passing.append((r, rec))
    names = list(dict.fromkeys(c["module"] or c["tensor"] for c in clip["clipped"]))
    summary = {"clipped": names[:8], "summary": int8_ranges.summary(clip), "repairs": tried, "chosen": None,
               "before": "passed" if base.passed else "failed"}
    if not passing:
        base.int8_repairs = summary
        if not base.passed:
            base.errors.append(f"{int8_ranges.summary(clip)}; repairs tried: "
                               + ", ".join(t["repair"] for t in tried if t["tried"]) + "; none passes")
        return base
    best, rec = min(passing, key=lambda p: (p[1]["bytes_added"], p[0].latency if p[0].latency is not None else 0.0))
    summary["chosen"] = rec["repair"]
    best.int8_repairs = summary
    lat = (f", latency {base.latency:.3g} -> {best.latency:.3g} ms" if best.latency is not None
           and base.latency is not None else "")
    why = "missed its bound" if not base.passed else "passed with an output clipped"
    best.candidates, best.chosen_because = base.candidates, (
        f"{base.quantization} {why}, its int8 ranges clipping {', '.join(names[:3])}; ships with {rec['repair']} "
        f"({rec['bytes_added']:+d} bytes{lat})")
    best.warnings.append(best.chosen_because)
    return best


def _scopes(r: TargetResult, tensors: list[str]) -> list[tuple[str, str]]:
    """(module, op scope) of the ops that produce `tensors` in r's variant."""
    if r.info is None:
        return []
    index = {t["name"]: i for i, t in r.info.tensors.items()}
    out = []
    for name in tensors:
        op = next((o for o in r.info.ops if index.get(name) in o["outputs"]), None)
        if op is not None:
            scope = ";".join(r.info.tensors[i]["name"] for i in op["outputs"])
            out.append((module_path(name) or name, scope))
    return list(dict.fromkeys(out))


def _diagnose(r: TargetResult, run: _Run) -> None:
    """Conversion error or precision loss, and the first diverging layer, for a failed target."""
    p = r.parity or {}
    if r.quantization != "float32" and "vs_float" in p:
        vf = p["vs_float"]
        p["diagnosis"] = (f"precision loss ({r.quantization}): the float32 export matches PyTorch; this variant "
                          f"departs from it (cosine {vf['cosine']:.6f}, max_abs {vf['max_abs']:.3g} vs the float32 "
                          "artifact)")
        r.errors.append(p["diagnosis"])
    if run.model.localizes and r.artifact is not None:
        loc = p.get("first_divergence")  # the float32 gate localized its own failure already
        if loc is None:
            run.say(f"{r.target}: parity failed; localizing the first diverging layer")
            with _Clock(r.timings_s)("localize"):
                loc = _explain(run, r.artifact, r.info, r.warnings)
        if loc:
            p["first_divergence"] = loc
            fused = f" fused with {loc['fused_with']}" if loc.get("fused_with") else ""
            r.errors.append(f"first diverging layer: {loc['module']} ({loc['op']}{fused}, relative error "
                            f"{loc['rel_err']:.3g})")


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
    # web: the MediaPipe task's JavaScript when the artifact is app-ready (convert/app_io), as its bucket snippet
    language = prof.app_snippet or ("js" if prof.browser_parity else "")
    snippet = write_snippet(language, model_json, sub, out.name) if app else None
    if snippet:
        r.app_snippet = model_json["app_snippet"] = str(out / prof.name / snippet.name)
    _write_layer_errors(r, sub, out / rel, model_json)
    files.atomic_write_json(sub / "model.json", model_json)
    for soc, compiled in r.npu_models.items():  # android-npu: DIR/android-npu/<SoC>/model.tflite
        (sub / soc).mkdir(exist_ok=True)
        (sub / soc / "model.tflite").write_bytes(compiled)
        stats = r.npu["socs"][soc]
        files.atomic_write_json(sub / soc / "model.json", soc_model_json(
            model_json, soc, r.npu["qnn_version"], sha256=files.sha256_file(sub / soc / "model.tflite"),
            size_bytes=len(compiled), npu={k: v for k, v in stats.items() if k != "soc"}))
        stats["artifact"] = str(out / rel / soc / "model.tflite")
    if r.passed and r.npu_models:  # Play's AI pack: an app file, like the snippet; the artifacts passed either way
        try:
            pack = write_ai_pack(r.artifact.model, r.npu_models, sub / "ai_pack", out.name)
            r.npu["ai_pack"] = {"dir": str(out / rel / "ai_pack"), "files": pack}
        except Exception as e:  # noqa: BLE001
            r.warnings.append(f"no AI pack: LiteRT's exporter failed ({_why(e)})")


def _write_layer_errors(r: TargetResult, sub: Path, where: Path, model_json: dict) -> None:
    """A failing or precision-losing target: the per-layer error its localization measured, as a Model
    Explorer overlay beside the artifact (verdict/layer_errors.py), named in model.json and report.json."""
    loc = (r.parity or {}).get("first_divergence")
    if r.layer_errors is None and loc and r.info is not None:
        overlay = layer_errors.overlay(loc, r.info)
        r.layer_errors = {"overlay": overlay, "measured_on": f"this artifact ({r.quantization})"} if overlay else None
    if r.layer_errors is None:
        return
    files.atomic_write_json(sub / layer_errors.FILE, r.layer_errors["overlay"])
    r.layer_errors.update(file=str(where / layer_errors.FILE),
                          view=layer_errors.command(str(where / "model.tflite"), str(where / layer_errors.FILE)))
    model_json["layer_errors"] = {k: v for k, v in r.layer_errors.items() if k != "overlay"}


def _firmware(prof: TargetProfile, r: TargetResult, sub: Path, say: Progress) -> None:
    """Firmware files next to a passed artifact (iot): C array + the arena TFLM needed."""
    say(f"{prof.name}: model_data.cc/.h and the TFLM arena")
    try:
        used = measure_arena(r.artifact.model, max_arena=prof.max_arena_bytes or 64 * 1024 * 1024)
    except Exception as e:  # noqa: BLE001 - a ConversionError, or TFLM's worker crashing: the artifact still passed
        r.warnings.append(f"no firmware files: {e if isinstance(e, ConversionError) else _why(e)}")
        return
    paths = write_c_array(r.artifact.model, sub, arena_used=used, sha256=r.sha256)
    r.firmware = {"files": [p.name for p in paths], "arena_used_bytes": used,
                  "tensor_arena_size": suggested_arena(used), "measured_on": "tflite-micro interpreter"}


class _Clock:
    """`with clock("stage"):` adds the stage's wall seconds to a dict (the report's timings_s)."""

    def __init__(self, into: dict):
        self.into, self.name, self.t, self.waited = into, None, 0.0, 0.0

    def __call__(self, name: str):
        self.name = name
        return self

    def __enter__(self):
        self.t, self.waited = time.perf_counter(), overlap.turn_wait_s()

    def __exit__(self, *exc):
        # less the time this target waited while other targets had their turn (overlap.py)
        spent = time.perf_counter() - self.t - (overlap.turn_wait_s() - self.waited)
        self.into[self.name] = self.into.get(self.name, 0.0) + spent


def _versions() -> dict:
    out = {}
    for dist in ("torch", "litert-torch", "ai-edge-litert", "ai-edge-quantizer", "tflite-micro"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out
