"""`convert(...)`: one PyTorch model -> a checked LiteRT artifact per target.

load -> one float export -> per target: derive variant, check compatibility,
run parity on the target's runtime, measure latency -> write everything in a
staging folder and move it into place. Targets that fail keep their artifact
only under DIR/<target>/failed/, so a valid-looking DIR/<target>/model.tflite
always passed its checks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from tpu_pipeline import files
from tpu_pipeline.errors import ConversionError, ParityError, PipelineError, UserError

from . import checks, parity
from .browser import browser_unavailable, run_litertjs
from .export import export_float
from .firmware import measure_arena, suggested_arena, write_c_array
from .lm_pipeline import convert_lm, is_causal_lm_folder
from .loaders import LoadedModel, flatten_outputs, load_model
from .quantize import quantize
from .report import render_html
from .runtimes import LitertRunner, from_artifact, run_micro, to_artifact
from .snippets import write_snippet
from .targets import TargetProfile, load_profiles, resolve_targets
from .tflite_info import ModelInfo, inspect_model

Progress = Callable[[str], None]
CALIB_RANDOM_SAMPLES = 16
REFERENCE_SAMPLES = 2
LOCALIZE_SAMPLES = 4  # layer errors are averaged over these parity samples
MEASURE_THREADS = 1  # torch eager and LiteRT both on one thread: comparable and stable when cores are shared
LATENCY_BUDGET_S = 0.25  # per measurement: at least 5, at most 50 runs


@dataclasses.dataclass(kw_only=True)
class ConvertOptions:
    targets: str = "all"                 # all or a comma list of target names
    out: str | Path | None = None        # default dist/<model stem>/
    input_shapes: tuple[str, ...] = ()   # --input-shape, one per input
    model_class: str | None = None
    model_kwargs: str | None = None
    trust_pickle: bool = False
    calib: str | Path | None = None      # .npz of representative inputs (static int8 calibration)
    eval_data: str | Path | None = None  # .npz of parity inputs
    samples: int = 8
    atol: float | None = None
    rtol: float | None = None
    min_cosine: float | None = None
    seed: int = 0
    latency: bool = True
    profile_dir: str | Path | None = None
    prompts: str | Path | None = None    # LMs: text file, one parity prompt per line (default: random tokens)
    lm_max_len: int | None = None        # LMs: KV-cache length (default: min(max_position_embeddings, 256))
    lm_prefill_len: int | None = None    # LMs: tokens per prefill call (default: min(32, max_len))


def convert(model_path: str | Path, options: ConvertOptions | None = None, progress: Progress | None = None) -> dict:
    """Runs the whole conversion; returns the report. Raises ConversionError (some target
    failed to convert or its checks) or ParityError (all converted, some failed parity)
    after the output folder is in place; UserError before anything is written."""
    o = options or ConvertOptions()
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    if o.samples < 1:
        raise UserError("--samples must be at least 1")
    profiles = resolve_targets(o.targets, load_profiles(o.profile_dir))
    model_path = Path(model_path)
    out = Path(o.out) if o.out else Path("dist") / (model_path.stem if model_path.is_file() else model_path.name)
    torch.manual_seed(o.seed)
    rng = np.random.default_rng(o.seed)
    if is_causal_lm_folder(model_path):
        explicit = [p.name for p in profiles if not p.causal_lm] if o.targets.strip() != "all" else []
        if explicit:
            raise UserError(f"target {explicit[0]} does not take a causal LM (its profile has causal_lm = false)")
        report, _ = convert_lm(model_path, o, profiles, out, say)
        _raise_for(report)
        return report

    say("load: reading " + str(model_path))
    m = load_model(model_path, input_shapes=list(o.input_shapes), model_class=o.model_class,
                   model_kwargs=o.model_kwargs, trust_pickle=o.trust_pickle)
    calib_data, calib_source = None, None
    if o.calib:
        calib_data, calib_source = _read_npz(o.calib, m, "--calib"), "--calib"
    elif m.calibration is not None:
        calib_data, calib_source = _rows(m.calibration, m), "the manifest's calibration_inputs"
    eval_data = _read_npz(o.eval_data, m, "--eval-data") if o.eval_data else None
    samples, sample_source, calib_data = _parity_samples(m, eval_data, calib_data, calib_source, o.samples, rng)
    with torch.no_grad(), _threads(MEASURE_THREADS):
        ref = [[t.float().numpy() for t in flatten_outputs(m.module(*[torch.from_numpy(x) for x in s]))] for s in samples]

    with tempfile.TemporaryDirectory(prefix="tpu-pipeline-convert-") as work, files.staged_dir(out) as stage:
        work = Path(work)
        say("export: torch -> float32 .tflite (litert-torch, traced once)")
        t_exp = time.perf_counter()
        float_model = export_float(m, work / "float.tflite")
        export_s = time.perf_counter() - t_exp
        float_info = inspect_model(float_model)
        notes = list(m.notes) + _dtype_notes(m, float_info)
        warnings = []
        calib = None
        if any(p.precision == "static_int8" for p in profiles):
            if calib_data is None:
                warnings.append("WARNING: static int8 was calibrated on random-normal inputs (no --calib given); "
                                "pass --calib FILE.npz with real inputs or int8 accuracy on real data may be far worse")
                calib_samples = [_random_sample(m, rng) for _ in range(CALIB_RANDOM_SAMPLES)]
            else:
                calib_samples = calib_data
            calib = [{t.key: np.asarray(x).astype(t.dtype) for x, t in zip(s, float_info.inputs)} for s in calib_samples]

        torch_ms = _torch_latency(m) if o.latency else None
        results, variants = {}, {}
        by_name = {p.name: p for p in profiles}
        for prof in profiles:
            results[prof.name] = _target(prof, m, float_model, calib, samples, ref, o, torch_ms, variants, say)
        report = {
            "model": str(model_path), "source_format": m.source_format, "task": m.task,
            "inputs": [{"name": n, "shape": list(a.shape), "dtype": str(a.dtype).replace("torch.", "")}
                       for n, a in zip(m.input_names, m.sample_args)],
            "output_names": m.output_names, "samples": len(samples), "sample_source": sample_source,
            "notes": notes, "warnings": warnings, "export_s": export_s, "versions": _versions(),
            "targets": {},
        }
        say("write: artifacts, model.json, report.json, report.html")
        for name, r in results.items():
            art = r.pop("_bytes", None)
            info: ModelInfo | None = r.pop("_info", None)
            sub = stage / name / ("" if r["passed"] else "failed")
            if art is not None:
                sub.mkdir(parents=True, exist_ok=True)
                (sub / "model.tflite").write_bytes(art)
                r["artifact"] = str((out / name / ("" if r["passed"] else "failed") / "model.tflite"))
                r["sha256"] = files.sha256_file(sub / "model.tflite")
                if r["passed"]:
                    _app_files(by_name[name], art, r, sub, say)
                model_json = _model_json(name, r, m, info, notes)
                snippet = write_snippet(by_name[name].app_snippet, model_json, sub, out.name) if r["passed"] else None
                if snippet:
                    r["app_snippet"] = model_json["app_snippet"] = str(out / name / snippet.name)
                model_json["firmware"] = r.get("firmware")
                files.atomic_write_json(sub / "model.json", model_json)
            report["targets"][name] = r
        report["wall_s"] = time.perf_counter() - t0
        report["passed"] = all(r["passed"] for r in report["targets"].values())
        files.atomic_write_json(stage / "report.json", report)
        files.atomic_write_text(stage / "report.html", render_html(report))
    report["out"] = str(out)
    _raise_for(report)
    return report


def _target(prof: TargetProfile, m: LoadedModel, float_model: bytes, calib, samples, ref, o: ConvertOptions,
            torch_ms, variants: dict, say: Progress) -> dict:
    r = {"target": prof.name, "quantization": prof.precision, "runtime": prof.runtime_note, "passed": False,
         "errors": [], "warnings": [], "size_bytes": None, "parity": None, "latency_ms": None, "timings_s": {}}
    clock = _Clock(r["timings_s"])
    try:
        if prof.precision not in variants:
            if prof.precision != "float32":
                say(f"{prof.name}: quantize ({prof.precision}, ai-edge-quantizer)")
            with clock("quantize"):
                variants[prof.precision] = quantize(float_model, prof.precision, calib)
        art = variants[prof.precision]
        info = inspect_model(art)
        r["_bytes"], r["_info"], r["size_bytes"] = art, info, len(art)
        say(f"{prof.name}: compatibility checks")
        with clock("checks"):
            comp = checks.check(prof, art, info)
        r["compatibility"] = comp
        r["warnings"] += comp["warnings"]
        if not comp["passed"]:
            r["errors"] += comp["violations"]
            r["failure"] = "compatibility"
            return r
        say(f"{prof.name}: parity on {prof.runtime} over {len(samples)} samples")
        with clock("parity"):
            r["parity"] = _parity(prof, m, art, info, samples, ref, o)
        r["passed"] = r["parity"]["passed"]
        skipped = (r["parity"].get("browser") or {}).get("skipped")
        if skipped:
            r["runtime"] = "ai-edge-litert XNNPACK only (LiteRT.js browser run skipped)"
            r["warnings"].append(f"browser parity skipped: {skipped}")
        if not r["passed"]:
            r["failure"] = "parity"
            r["errors"] += r["parity"]["reasons"]
            say(f"{prof.name}: parity failed; localizing the first diverging layer")
            with clock("localize"):
                loc = parity.localize(m.module, samples[:LOCALIZE_SAMPLES], art, info)
            if loc:
                r["parity"]["first_divergence"] = loc
                r["errors"].append(f"first diverging layer: {loc['module']} ({loc['op']}, relative error {loc['rel_err']:.3g})")
        if o.latency:
            say(f"{prof.name}: latency on ai-edge-litert")
            threads = MEASURE_THREADS
            with clock("latency"):
                art_ms = LitertRunner(art, info, threads=threads).latency_ms(samples[0])
            r["latency_ms"] = {"artifact": art_ms, "torch_eager": torch_ms, "threads": threads,
                               "speedup_vs_torch": (torch_ms / art_ms) if art_ms else None,
                               "runtime": "ai-edge-litert (XNNPACK)"}
    except ConversionError as e:
        r["errors"].append(str(e))
        r["failure"] = "conversion"
    return r


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


def _parity(prof, m, art, info, samples, ref, o) -> dict:
    classifier = m.task in ("classification", "causal-lm") or m.task is None
    if prof.runtime == "tflite-micro":
        arena = prof.max_arena_bytes or 64 * 1024 * 1024
        got = run_micro(art, info, samples, arena)
        kernel = None
    else:
        xnn = LitertRunner(art, info)
        refk = LitertRunner(art, info, reference=True)
        got = [xnn.run(s) for s in samples]
        # Reference kernels are naive loops (seconds per sample on convs): a few samples tell
        # kernel noise from conversion error.
        got_ref = [refk.run(s) for s in samples[:REFERENCE_SAMPLES]]
        kernel = {"max_abs_xnnpack_vs_reference": float(max(np.abs(np.asarray(a, np.float64) - b).max()
                                                                for g, gr in zip(got, got_ref) for a, b in zip(g, gr)))}
    outputs = {}
    names = m.output_names or [f"output_{i}" for i in range(len(ref[0]))]
    for k, name in enumerate(names):
        outputs[name] = parity.compare([s[k] for s in ref], [g[k] for g in got], classifier=classifier,
                                       atol=o.atol if o.atol is not None else prof.atol,
                                       rtol=o.rtol if o.rtol is not None else prof.rtol)
    passed, reasons = parity.judge(outputs, prof, atol=o.atol, rtol=o.rtol, min_cosine=o.min_cosine)
    res = {"passed": passed, "reasons": reasons, "outputs": outputs,
           "tolerances": parity.tolerances(prof, o.atol, o.rtol, o.min_cosine), "runtime": prof.runtime}
    if prof.browser_parity:
        res["browser"] = browser = _browser_parity(prof, art, info, samples, ref, names, classifier, o)
        if browser.get("passed") is False:
            res["passed"] = False
            res["reasons"] += [f"in the browser (LiteRT.js): {x}" for x in browser["reasons"]]
    first = outputs[names[0]]
    res.update({k: first[k] for k in ("max_abs", "rmse", "cosine", "cosine_mean", "snr_db") if k in first})
    if "top1" in first:
        res["top1"] = first["top1"]
    if kernel:
        res["kernel_noise"] = kernel
        if not passed:
            ref_outputs = {n: parity.compare([s[k] for s in ref[:len(got_ref)]], [g[k] for g in got_ref], classifier=classifier,
                                             atol=prof.atol, rtol=prof.rtol) for k, n in enumerate(names)}
            ok_ref, _ = parity.judge(ref_outputs, prof, atol=o.atol, rtol=o.rtol, min_cosine=o.min_cosine)
            res["diagnosis"] = ("XNNPACK kernel noise: the reference kernels pass" if ok_ref else
                                "conversion error: the reference kernels fail too")
    return res


def _app_files(prof: TargetProfile, art: bytes, r: dict, sub: Path, say: Progress) -> None:
    """Firmware files next to a passed artifact (iot): C array + the arena TFLM needed."""
    if not prof.firmware:
        return
    say(f"{prof.name}: model_data.cc/.h and the TFLM arena")
    try:
        used = measure_arena(art, max_arena=prof.max_arena_bytes or 64 * 1024 * 1024)
    except ConversionError as e:
        r["warnings"].append(f"no firmware files: {e}")
        return
    paths = write_c_array(art, sub, arena_used=used, sha256=r["sha256"])
    r["firmware"] = {"files": [p.name for p in paths], "arena_used_bytes": used,
                     "tensor_arena_size": suggested_arena(used), "measured_on": "tflite-micro interpreter"}


def _browser_parity(prof, art: bytes, info: ModelInfo, samples, ref, names, classifier, o) -> dict:
    """The web target's parity in a real browser (LiteRT.js in headless Chromium)."""
    reason = browser_unavailable()
    if reason:
        return {"skipped": reason}
    feed = [[to_artifact(x, t) for x, t in zip(s, info.inputs)] for s in samples]
    got = run_litertjs(art, feed, input_names=[t.key for t in info.inputs], output_names=[t.key for t in info.outputs])
    got = [[from_artifact(y, t) for y, t in zip(row, info.outputs)] for row in got]
    outputs = {name: parity.compare([s[k] for s in ref], [g[k] for g in got], classifier=classifier,
                                    atol=o.atol if o.atol is not None else prof.atol,
                                    rtol=o.rtol if o.rtol is not None else prof.rtol)
               for k, name in enumerate(names)}
    passed, reasons = parity.judge(outputs, prof, atol=o.atol, rtol=o.rtol, min_cosine=o.min_cosine)
    first = outputs[names[0]]
    return {"runtime": "LiteRT.js (@litertjs/core, wasm) in headless Chromium", "passed": passed, "reasons": reasons,
            "outputs": outputs, **{k: first[k] for k in ("max_abs", "rmse", "cosine", "top1") if k in first}}


def _raise_for(report: dict) -> None:
    failed = {n: t for n, t in report["targets"].items() if not t["passed"]}
    if not failed:
        return
    parts = [f"{n}: {t['errors'][0] if t['errors'] else 'failed'}" +
             (f" [{t['errors'][-1]}]" if len(t["errors"]) > 1 and "first diverging layer" in t["errors"][-1] else "")
             for n, t in failed.items()]
    msg = f"{len(failed)} of {len(report['targets'])} targets failed ({'; '.join(parts)}); report: {report['out']}/report.json"
    err = (ConversionError(msg) if any(t.get("failure") in ("compatibility", "conversion") for t in failed.values())
           else ParityError(msg))
    err.report = report  # the CLI prints it with --json
    raise err


def _random_sample(m: LoadedModel, rng) -> list[np.ndarray]:
    s = []
    for a, high in zip(m.sample_args, m.int_high):
        if a.is_floating_point():
            s.append(rng.standard_normal(tuple(a.shape)).astype(np.float32))
        elif a.dtype == torch.bool:
            s.append(rng.random(tuple(a.shape)) > 0.5)
        else:
            s.append(rng.integers(0, max(high or 2, 1), tuple(a.shape)).astype(str(a.dtype).replace("torch.", "")))
    return s


def _parity_samples(m, eval_data, calib_data, calib_source, n, rng):
    """-> (parity samples, where they came from, calibration rows). Real data beats random;
    with enough calibration rows the last n are held out of calibration for parity."""
    if eval_data:
        return eval_data[:n], f"--eval-data ({min(n, len(eval_data))} rows)", calib_data
    if calib_data:
        if len(calib_data) >= 2 * n:
            return calib_data[-n:], f"{calib_source} (last {n} rows, held out of calibration)", calib_data[:-n]
        return calib_data[:n], f"{calib_source} ({min(n, len(calib_data))} rows, also used for calibration)", calib_data
    first = [a.numpy() for a in m.sample_args]
    return [first] + [_random_sample(m, rng) for _ in range(n - 1)], "the model's example inputs + random inputs", None


def _rows(tensors: list[torch.Tensor], m: LoadedModel) -> list[list[np.ndarray]]:
    arrays = [t.detach().cpu().to(a.dtype).numpy() for t, a in zip(tensors, m.sample_args)]
    n = min(len(a) for a in arrays)
    if n == 0:
        raise UserError("calibration_inputs holds no rows")
    return [[a[i:i + 1] for a in arrays] for i in range(n)]


def _read_npz(path, m: LoadedModel, flag: str) -> list[list[np.ndarray]]:
    """An .npz with one array per input (named like the input, or arr_0..): shape (N, *input_shape[1:])."""
    try:
        data = np.load(path, allow_pickle=False)
        keys = list(data.files)
    except Exception as e:  # noqa: BLE001
        raise UserError(f"{flag} {path}: not a readable .npz file ({type(e).__name__})") from None
    arrays = []
    for i, (name, a) in enumerate(zip(m.input_names, m.sample_args)):
        key = name if name in keys else (f"arr_{i}" if f"arr_{i}" in keys else (keys[i] if i < len(keys) else None))
        if key is None:
            raise UserError(f"{flag} {path}: no array for input {name!r} (keys: {', '.join(keys)})")
        arr = data[key]
        if tuple(arr.shape[1:]) != tuple(a.shape[1:]):
            raise UserError(f"{flag} {path}: array {key!r} has shape {list(arr.shape)}; expected (N, {', '.join(map(str, a.shape[1:]))})")
        arrays.append(arr.astype(str(a.dtype).replace("torch.", "")))
    n = min(len(a) for a in arrays)
    if n == 0:
        raise UserError(f"{flag} {path}: holds no rows")
    return [[a[i:i + 1] for a in arrays] for i in range(n)]


def _dtype_notes(m: LoadedModel, info: ModelInfo) -> list[str]:
    notes = []
    for name, a, t in zip(m.input_names, m.sample_args, info.inputs):
        src = str(a.dtype).replace("torch.", "")
        if src != t.dtype and not (t.scale and t.dtype == "int8"):
            notes.append(f"input {name}: {src} in PyTorch is {t.dtype} in the artifact; feed {t.dtype} (parity did)")
    return notes


@contextlib.contextmanager
def _threads(n: int):
    """torch's intra-op threads for a measurement. One thread: OpenMP workers spin-wait,
    and on a shared 2-core machine two threads made eager timings 100x noisier."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _torch_latency(m: LoadedModel) -> float:
    with torch.no_grad(), _threads(MEASURE_THREADS):
        m.module(*m.sample_args)
        times: list[float] = []
        while len(times) < 5 or (sum(times) < LATENCY_BUDGET_S and len(times) < 50):
            t = time.perf_counter()
            m.module(*m.sample_args)
            times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)


def _model_json(name: str, r: dict, m: LoadedModel, info: ModelInfo, notes: list[str]) -> dict:
    ins = [{"name": n, **t.to_json()} for n, t in zip(m.input_names, info.inputs)]
    outs = [{"name": n, **t.to_json()} for n, t in zip(m.output_names or [], info.outputs)]
    return {"format": "tpu-pipeline/litert-artifact@1", "target": name, "passed": r["passed"],
            "quantization": r["quantization"], "runtime": r["runtime"], "size_bytes": r["size_bytes"],
            "sha256": r.get("sha256"), "signature": "serving_default", "inputs": ins, "outputs": outs,
            "task": m.task, "notes": notes, "parity": r["parity"], "latency_ms": r["latency_ms"],
            "errors": r["errors"], "warnings": r["warnings"]}


def _versions() -> dict:
    out = {}
    for dist in ("torch", "litert-torch", "ai-edge-litert", "ai-edge-quantizer", "tflite-micro"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out
