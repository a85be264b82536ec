"""The `module` model kind: an nn.Module with fixed-shape tensor inputs
(classifiers, encoders, a Hugging Face LM's fixed-length forward), exported
once with litert-torch and judged output by output: cosine, elementwise
tolerance, top-1 agreement for class scores, on XNNPACK with the reference
kernels beside the float32 export (TFLM for iot, LiteRT.js in Chromium for
web); a quantized variant is also compared with the float32 artifact, to tell
precision loss from conversion error. Targets whose delegate computes in
float16 (android, ios) get the float16-activation sensitivity. A failed target
names the first PyTorch layer whose output diverges; a failed quantized variant
can be rebuilt with that layer kept in float32 (variant_keeping_float)."""

from __future__ import annotations

import copy
import dataclasses
import re
import time
from pathlib import Path

import numpy as np
import torch

from tpu_pipeline.convert.app_io import AppIO, describe
from tpu_pipeline.convert.app_io import client as app_client
from tpu_pipeline.convert.app_io import metadata as app_metadata
from tpu_pipeline.convert.app_io.graph import app_graph, to_app
from tpu_pipeline.convert.app_io.metadata import app_json
from tpu_pipeline.convert.kinds import ModelKind, Progress, register_kind
from tpu_pipeline.convert.module import lstm_int8
from tpu_pipeline.convert.module.accelerators import FLOAT16_CHECK, Pending
from tpu_pipeline.convert.module.export import export_float
from tpu_pipeline.convert.module.global_pool import as_mean
from tpu_pipeline.convert.module.loaders import LoadedModel, flatten_outputs, load_model
from tpu_pipeline.convert.module.lstm_reset import lstm_count
from tpu_pipeline.convert.module.lstm_weights import int8_weights
from tpu_pipeline.convert.module.max_pool import as_amax
from tpu_pipeline.convert.module.recurrent import UNROLLED, as_fused
from tpu_pipeline.convert.options import DEFAULT_SAMPLES, ConvertOptions
from tpu_pipeline.convert.precision import tflm_int8
from tpu_pipeline.convert.precision.quantize import CALIBRATED, DEFAULT_RANGES, quantize
from tpu_pipeline.convert.precision.xnnpack_int8 import whole_on_xnnpack
from tpu_pipeline.convert.result import Artifact, Parity, TargetResult
from tpu_pipeline.convert.runtimes.browser import browser_unavailable, run_litertjs
from tpu_pipeline.convert.runtimes.litert import LitertRunner, from_artifact, run_micro, to_artifact
from tpu_pipeline.convert.runtimes.measure import MEASURE_THREADS, median_ms, torch_threads
from tpu_pipeline.convert.targets import TargetProfile
from tpu_pipeline.convert.tflite_info import ModelInfo, inspect_model
from tpu_pipeline.convert.tool_output import first_line
from tpu_pipeline.convert.verdict import eval_data, output_kinds, parity, task_score
from tpu_pipeline.errors import ConversionError, UserError
from tpu_pipeline.user_code import load_function

CALIB_RANDOM_SAMPLES = 16
OPTIONAL_INT8 = "static_int8_float_io"  # a candidate beside others only with calibration rows given
NO_CALIB_NOTE = (f"{OPTIONAL_INT8} not measured: no calibration rows (give --calib FILE.npz, calibration= or the "
                 "manifest's calibration_inputs); float16 and dynamic int8 need none")
REFERENCE_SAMPLES = 2
LOCALIZE_SAMPLES = 4  # layer errors are averaged over these parity samples
FLOAT16_DELEGATES = ("gpu", "coreml")  # delegates that compute activations in float16 on the phone
FLOAT16_LOSSY = 1e-2  # relative error of a layer's float16 output that counts as losing precision
LM_ONLY = "applies to Hugging Face causal-LM folders with tokenizer.json only"
LSTM_INT8_NOTE = ("dynamic_int8, static_int8_float_io: the fused LSTMs' gate weights in int8 (TFLite's hybrid LSTM kernel, "
                  "module/lstm_weights.py): ai-edge-quantizer 0.10 leaves UNIDIRECTIONAL_SEQUENCE_LSTM float32")


@register_kind("module")
class ModuleKind(ModelKind):
    """An nn.Module with fixed-shape tensor inputs (a .pt2, a model.pt manifest, a state_dict with
    --model-class, an HF folder's fixed-length forward, or in memory), judged output by output."""

    detect_order = 100  # the catch-all: asked last
    noun = "this model"
    localizes = True
    refines = True
    refused_options = {"prompts": LM_ONLY, "lm_max_len": LM_ONLY, "lm_prefill_len": LM_ONLY}

    def __init__(self, m: LoadedModel, samples: list[list[np.ndarray]], sample_source: str,
                 calib_data: list[list[np.ndarray]] | None, ref: list[list[np.ndarray]],
                 given_kinds: dict[str, str] | None = None, eval_set: eval_data.EvalData | None = None,
                 eval_ref: list[list[np.ndarray]] | None = None, metric=None, seed: int = 0):
        self.m, self.samples, self.sample_source, self.ref = m, samples, sample_source, ref
        # labelled eval rows (task_score.py): PyTorch's outputs on all of them; the task is scored once
        # the float graph has said what each output is (export_float)
        self.eval_set, self.eval_ref, self.metric_spec, self.seed = eval_set, eval_ref, metric, seed
        self.task: task_score.TaskScore | None = None
        self.max_drop_given: dict[str, float] = {}  # --max-task-drop, parsed (task_score.parse_max_drop)
        self._eval_got: dict[tuple[int, str], tuple[bytes, list]] = {}
        self.given_kinds = dict(given_kinds or {})
        self.app: AppIO | None = None  # what an app hands the model (app_io), set by from_loaded
        # per output: (kind, where it came from); decided once the float graph is known (export_float)
        self.kinds: list[tuple[str, str]] = [self._kind_without_graph(k) for k in range(len(ref[0]))]
        self.calib_data = calib_data
        self.calib: list[dict[str, np.ndarray]] | None = None
        self.calib_overlap: dict | None = None  # parity rows that are also calibration rows (prepare)
        self.notes = list(m.notes)
        self.torch_ms: float | None = None
        self.float_art: Artifact | None = None
        self._f16: dict | None = None
        self._unfused: tuple | None = None  # (module before as_fused, work dir) when the export fused an LSTM
        self._unrolled: Artifact | None = None  # its unfused float32 export, for web (made on demand)
        self._f16_weights: list[list[float]] | None = None  # precision_error("float16"), measured once
        # id(model bytes) -> (bytes, outputs per sample): targets that share a variant and runtime run it once
        self._xnnpack: dict[int, tuple[bytes, list]] = {}

    @staticmethod
    def detect(path: Path) -> bool:
        return True  # the fallback: the loader says what it cannot read

    @classmethod
    def load(cls, path: Path, o: ConvertOptions, rng: np.random.Generator, say: Progress) -> ModuleKind:
        say("load: reading " + str(path))
        m = load_model(path, input_shapes=list(o.input_shapes), model_class=o.model_class,
                       model_kwargs=o.model_kwargs, trust_pickle=o.trust_pickle)
        return cls.from_loaded(m, o, rng)

    @classmethod
    def from_loaded(cls, m: LoadedModel, o: ConvertOptions, rng: np.random.Generator, *,
                    eval_set: eval_data.EvalData | None = None) -> ModuleKind:
        """The kind for a model already in memory (the Python API hands over an nn.Module).
        eval_set: eval rows already decoded (a Hugging Face folder's raw data through its processor)."""
        calib_data, calib_source = None, None
        if isinstance(o.calib, (str, Path)):
            calib_data, calib_source = _read_npz(o.calib, m, "--calib"), "--calib"
        elif o.calib is not None:
            calib_data, calib_source = _sample_rows(o.calib, m), "calibration"
        elif m.calibration is not None:
            calib_data, calib_source = _rows(m.calibration, m), "the manifest's calibration_inputs"
        ev = eval_set or (eval_data.read(o.eval_data, _input_specs(m), "--eval-data") if o.eval_data else None)
        if o.metric is not None and (ev is None or ev.labels is None):
            raise UserError("--metric scores the model against labels: give --eval-data FILE.npz with a "
                            f"{eval_data.LABELS_KEY!r} array, or a samples folder with {eval_data.LABELS_FILE}")
        if isinstance(o.metric, str):
            load_function(o.metric, "--metric")  # a metric that cannot be imported: exit 2 before any work
        overlap = None
        if ev is not None and calib_data:
            calib_data, overlap = _without_rows(calib_data, ev.rows, calib_source)
        m, app = _app_graph(m, o)  # the graph apps feed (app_io); rows given in PyTorch's input space follow
        if app is not None:
            calib_data = calib_data and to_app(calib_data, m.input_names, app)
            ev = ev and dataclasses.replace(ev, rows=to_app(ev.rows, m.input_names, app))
        samples, source, calib_data = _parity_samples(m, ev.rows if ev else None, calib_data, calib_source,
                                                      o.samples, rng)
        try:
            with torch.no_grad(), torch_threads():
                ref = [[t.float().numpy() for t in flatten_outputs(m.module(*[torch.from_numpy(x) for x in s]))]
                       for s in samples]
                eval_ref = None
                if ev is not None and ev.labels is not None:
                    eval_ref = ref if samples is ev.rows else [
                        [t.float().numpy() for t in flatten_outputs(m.module(*[torch.from_numpy(x) for x in s]))]
                        for s in ev.rows]
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - rows the model cannot run (token ids beyond its table, ...) are bad input
            raise UserError(f"the model does not run on the parity rows from {source} ({type(e).__name__}: "
                            f"{first_line(e)})") from None
        given = {**output_kinds.parse(m.output_kinds or {}), **output_kinds.parse(o.output_kinds)}
        names = m.output_names or [f"output_{i}" for i in range(len(ref[0]))]
        stray = sorted(set(given) - set(names))
        if stray:
            raise UserError(f"--output-kind {stray[0]}: the model has no output of that name (outputs: "
                            f"{', '.join(names)})")
        kind = cls(m, samples, source, calib_data, ref, given, eval_set=ev, eval_ref=eval_ref, metric=o.metric,
                   seed=o.seed)
        kind.max_drop_given = o.max_task_drop if isinstance(o.max_task_drop, dict) else task_score.parse_max_drop(
            o.max_task_drop, [])
        if overlap:
            kind.notes.append(overlap)
        kind.app = app
        return kind

    def _kind_without_graph(self, k: int) -> tuple[str, str]:
        """Output k's kind from the user (--output-kind, the manifest's output_kinds, output_kinds=),
        else from what the model is (an LM's logits; a classification manifest's [N, C] head),
        else unknown. Never an output with spatial axes as class scores (segmentation N x C x H x W:
        the last axis is width)."""
        name = (self.m.output_names or [f"output_{i}" for i in range(len(self.ref[0]))])[k]
        if name in self.given_kinds:
            return self.given_kinds[name], "given"
        if self.m.task == "causal-lm":
            return "token_logits", "inferred: a causal LM's head"
        if self.m.task == "classification" and self.ref[0][k].ndim == 2 and self.ref[0][k].shape[-1] > 1:
            return "logits", "inferred: the manifest's task is classification ([N, C] head)"
        return "unknown", "neither inferred nor given"

    def output_kind(self, k: int) -> str:
        """Output k's kind (output_kinds.OUTPUT_KINDS), which decides how it is judged."""
        return self.kinds[k][0]

    def _infer_kinds(self, info: ModelInfo) -> None:
        """Where the user gave no kind: what the eval labels say of the output they score (the first),
        then the float graph's final op (output_kinds.decide): a softmax is probabilities; a sigmoid
        over a few values (a box head) is not class probabilities without labels that say so."""
        labels = self.eval_set.labels if self.eval_ref is not None else None
        for k, t in enumerate(info.outputs[:len(self.kinds)]):
            out = np.concatenate([row[k] for row in self.eval_ref]) if labels is not None and k == 0 else None
            width = int(self.ref[0][k].shape[-1]) if self.ref[0][k].ndim else 1
            self.kinds[k] = output_kinds.decide(self.kinds[k], output_kinds.final_activation(info, t.tensor_index),
                                                width, out, labels if out is not None else None)

    @property
    def output_names(self) -> list[str]:
        return self.m.output_names or [f"output_{i}" for i in range(len(self.ref[0]))]

    def export_float(self, work: Path, say: Progress) -> Artifact:
        say("export: torch -> float32 .tflite (litert-torch, traced once)")
        module, notes = as_mean(self.m.module, self.m.sample_args)
        module, maxed = as_amax(module)  # adaptive max pools to 1 as amax (litert-torch cannot lower them)
        notes += maxed
        unfused, (module, fused) = module, as_fused(module, self.m.sample_args)  # nn.LSTM as TFLite's fused op
        notes += fused
        self.notes += notes
        art = self.float_art = Artifact(model=export_float(dataclasses.replace(self.m, module=module),
                                                           work / "float.tflite"))
        self._unfused = (unfused, work) if lstm_count(art.model) else None
        info = inspect_model(art.model)
        self.notes += _dtype_notes(self.m, info)
        self._infer_kinds(info)
        if self.eval_ref is not None:
            torch_out = task_score.stack(self.eval_ref)
            metric = task_score.choose(self.metric_spec, self.eval_set.labels, torch_out[0], self.output_kind(0),
                                       self.output_names[0], len(torch_out))
            self.task = task_score.TaskScore(metric, self.eval_set.labels, torch_out, self.seed)
        return art

    def candidates(self, profile: TargetProfile) -> list[str]:
        precisions = list(profile.precisions) or [profile.precision]
        if self.calib_data is None and OPTIONAL_INT8 in precisions[1:]:
            # int8 activations calibrated on random inputs say nothing of real data: a phone's static int8
            # beside float16 is measured only on rows the user gave (--calib, calibration=, the manifest's
            # calibration_inputs); where it is the preferred precision (android-npu) it is calibrated on random
            # rows with prepare()'s warning, as iot's is
            precisions.remove(OPTIONAL_INT8)
            if NO_CALIB_NOTE not in self.notes:
                self.notes.append(NO_CALIB_NOTE)
        if self._unfused is not None and profile.browser_parity:
            return [p + UNROLLED for p in precisions]  # LiteRT.js loads no fused LSTM (docs/DESIGN.md)
        if self._unfused is not None and profile.runtime == "ai-edge-litert" and "dynamic_int8" not in precisions:
            # TFLite's float32 LSTM kernel runs 8 GEMV calls a step, as slow as its reference kernel and
            # slower than PyTorch eager on x86 for wide LSTMs; the hybrid one (int8 gate weights) ran 1.9x
            # faster (docs/BENCHMARKS.md). It is measured and ships only if it passes this profile's checks
            # (with labels, the task) and is faster: the report's candidates say which.
            precisions.append("dynamic_int8")
        return precisions

    def prepare(self, profiles: list[TargetProfile], float_model: Artifact, rng: np.random.Generator) -> list[str]:
        warnings = []
        if any(c in CALIBRATED for p in profiles for c in self.candidates(p)):
            if self.calib_data is None:
                kinds = ", ".join(dict.fromkeys("random-normal floats" if a.is_floating_point() else
                                                "random integers over the input's range (token ids: every row)"
                                                for a in self.m.sample_args))
                warnings.append(f"WARNING: static int8 was calibrated on random inputs ({kinds}; no --calib given); "
                                "pass --calib FILE.npz with real inputs or int8 accuracy on real data may be far worse")
                rows = [_random_sample(self.m, rng) for _ in range(CALIB_RANDOM_SAMPLES)]
            else:
                rows = self.calib_data
            inputs = inspect_model(float_model.model).inputs
            self.calib = [{t.key: np.asarray(x).astype(t.dtype) for x, t in zip(s, inputs)} for s in rows]
            self.calib_overlap = _calibration_overlap(self.samples, rows)
            if self.calib_overlap:
                warnings.append("WARNING: " + self.calib_overlap["why"])
        return warnings

    def variant(self, float_model: Artifact, precision: str) -> Artifact:
        float_model, precision = self._source(float_model, precision)
        if precision == "static_int8" and lstm_count(float_model.model):  # the quantizer leaves fused LSTMs float32
            if lstm_int8.NOTE not in self.notes:
                self.notes.append(lstm_int8.NOTE)
            return self._noted(Artifact(model=lstm_int8.full_integer(float_model.model, self.calib), precision=precision))
        model = self._quantized(float_model.model, precision, [])
        if precision in ("dynamic_int8", "static_int8_float_io") and lstm_count(model):  # the quantizer leaves fused LSTMs float32
            model = int8_weights(model)
            if LSTM_INT8_NOTE not in self.notes:
                self.notes.append(LSTM_INT8_NOTE)
        return self._noted(Artifact(model=model, precision=precision))

    @staticmethod
    def _keyed(model: bytes, sample: list[np.ndarray]) -> dict[str, np.ndarray]:
        """A parity sample as {input key: array} in the artifact's dtypes (what the quantizer's rows are)."""
        return {t.key: np.asarray(x).astype(t.dtype) for x, t in zip(sample, inspect_model(model).inputs)}

    def variant_keeping_float(self, float_model: Artifact, precision: str, scopes: list[str],
                              range_estimator: str = DEFAULT_RANGES) -> Artifact:
        float_model, precision = self._source(float_model, precision)
        return self._noted(Artifact(model=self._quantized(float_model.model, precision, scopes, range_estimator),
                                    precision=precision))

    def _quantized(self, source: bytes, precision: str, keep: list[str],
                   range_estimator: str = DEFAULT_RANGES) -> bytes:
        """`precision` of `source` with the `keep` op scopes float32; for XNNPACK's int8 forms also the ops
        XNNPACK runs in float but not in that int8 form (dynamic int8's DEPTHWISE_CONV_2D, static int8's
        SOFTMAX, GELU ...), kept float32 when that measures faster (the accuracy-aware rounds' variants too)."""
        def made(scopes: list[str]) -> bytes:
            return quantize(source, precision, self.calib, keep_float=scopes, range_estimator=range_estimator)

        model = made(keep)
        if precision in ("dynamic_int8", "static_int8_float_io") and (self.calib or precision == "dynamic_int8"):
            row = (self.calib or [self._keyed(source, self.samples[0])])[0]
            model, rec = whole_on_xnnpack(source, model, lambda scopes: made([*keep, *scopes]), row)
            if (note := f"{precision}: {rec['why']} (precision/xnnpack_int8.py)") not in self.notes:
                self.notes.append(note)
        return model

    def _noted(self, art: Artifact) -> Artifact:
        # what quantize rewrote for TFLM is named in the report (the artifact's metadata says it)
        self.notes += [n for n in tflm_int8.notes(art.model) if n not in self.notes]
        return art

    def parity(self, prof: TargetProfile, art: Artifact, info: ModelInfo, o: ConvertOptions, work: Path,
               say: Progress) -> Parity:
        say(f"{prof.name}: parity on {prof.runtime} over {len(self.samples)} samples")
        model, samples, ref, names = art.model, self.samples, self.ref, self.output_names
        got_ref = None
        is_float = self.float_art is not None and model is self.float_art.model
        accelerators = Pending(prof, model, info, samples)  # GPU / WebGPU runs, beside the CPU work below
        if prof.runtime == "tflite-micro":
            got = _run_micro(model, info, samples, prof)
        else:
            got = self._run_xnnpack(model, info)
            if is_float:
                # Reference kernels are naive loops (seconds per sample on convs): a few samples tell
                # kernel noise from conversion error. Variants are judged against the float artifact instead.
                refk = LitertRunner(model, info, reference=True)
                got_ref = [refk.run(s) for s in samples[:REFERENCE_SAMPLES]]
                if refk.fallback and (note := f"kernel-noise check: {refk.fallback}") not in self.notes:
                    self.notes.append(note)
        outputs = self._compare(prof, o, ref, got, self.precision_error(art.precision))
        v = parity.verdict(outputs, prof, atol=o.atol, rtol=o.rtol, min_cosine=o.min_cosine)
        passed = v["passed"]
        res = {"passed": passed, "reasons": v["reasons"], "decided_by": v["decided_by"], "checks": v["checks"],
               "outputs": outputs, "tolerances": parity.tolerances(prof, o.atol, o.rtol, o.min_cosine),
               "runtime": prof.runtime}
        if self.calib_overlap and art.precision.startswith("static_int8"):
            res["calibration_overlap"] = self.calib_overlap  # only a calibrated artifact is flattered
        warnings, runtime = list(v["notes"]), None
        if self.task is not None:
            passed = self._task_verdict(res, outputs, self._task_outputs(prof, model, info, got), prof, warnings)
        if prof.delegate in FLOAT16_DELEGATES:
            res["float16_activations"] = f16 = {"check": FLOAT16_CHECK, **self.float16_sensitivity()}
            if f16.get("first_nonfinite"):
                passed = res["passed"] = False
                res["reasons"].append(
                    f"the {prof.delegate} delegate computes in float16, and this model does not run in float16: "
                    f"PyTorch in float16 gives inf/NaN first at {f16['first_nonfinite']}")
        if prof.browser_parity:
            res["browser"] = browser = self._browser_parity(prof, art.model, info, o, got)
            if browser.get("passed") is False:
                res["passed"] = False
                res["reasons"] += [f"in the browser (LiteRT.js): {x}" for x in browser["reasons"]]
            if "skipped" in browser:
                runtime = "ai-edge-litert XNNPACK only (LiteRT.js browser run skipped)"
                warnings.append(f"browser parity skipped: {browser['skipped']}")
        # with labels the task score of the CPU run decides; the accelerators (8 rows) are judged
        # against that run, so they check the kernels and cannot overrule the task on every row
        accelerators.fold(res, warnings, self._judge(prof, o, art, against=got if self.task else None), got)
        res["judged"] = task_score.checks_judged(res, self.task is not None, len(self.samples))
        first = outputs[names[0]]
        res.update({k: first[k] for k in ("max_abs", "rmse", "cosine", "cosine_mean", "snr_db", "top1") if k in first})
        if not is_float and self.float_art is not None:
            # the variant against the float32 artifact: precision loss, separated from conversion error
            float_got = self._run_xnnpack(self.float_art.model, inspect_model(self.float_art.model))
            vs = self._compare(prof, o, [[np.asarray(y, np.float32) for y in row] for row in float_got], got)
            res["vs_float"] = {k: min(m[k] for m in vs.values()) for k in ("cosine", "cosine_mean")}
            res["vs_float"]["max_abs"] = max(m["max_abs"] for m in vs.values())
        if got_ref is not None:
            res["kernel_noise"] = {"max_abs_xnnpack_vs_reference": float(max(
                np.abs(np.asarray(a, np.float64) - b).max() for g, gr in zip(got, got_ref) for a, b in zip(g, gr))),
                "reference": refk.kernels, **({"fallback": refk.fallback} if refk.fallback else {})}
            if not passed:
                ok_ref, _ = parity.judge(self._compare(prof, o, ref[:len(got_ref)], got_ref), prof,
                                         atol=o.atol, rtol=o.rtol, min_cosine=o.min_cosine)
                res["diagnosis"] = (f"XNNPACK kernel noise: the {refk.kernels} pass" if ok_ref else
                                    "conversion error: the float32 export departs from PyTorch on the "
                                    f"{refk.kernels} too")
        return Parity(figures=res, warnings=warnings, runtime=runtime)

    def _task_outputs(self, prof: TargetProfile, model: bytes, info: ModelInfo, got: list) -> list:
        """The artifact's outputs on every labelled eval row, on the target's runtime (the parity run's
        own when its rows are the eval set; else one more run, once per artifact and runtime)."""
        if self.samples is self.eval_set.rows:
            return got
        key = (id(model), prof.runtime)
        hit = self._eval_got.get(key)
        if hit is None or hit[0] is not model:
            rows = self.eval_set.rows
            if prof.runtime == "tflite-micro":
                out = _run_micro(model, info, rows, prof)
            else:
                runner = LitertRunner(model, info)
                out = [runner.run(s) for s in rows]
            hit = self._eval_got[key] = (model, out)
        return hit[1]

    def _task_verdict(self, res: dict, outputs: dict, task_got: list, prof: TargetProfile, warnings: list) -> bool:
        """With labels the task score decides (task_score.py): the target passes when its task drop is
        within its bound (_max_drop: --max-task-drop, the metric's, the profile's) and no output is NaN/inf; the numeric and kind criteria stay
        in the report (`numeric_verdict`), since they would refuse artifacts the task accepts (an int8
        pitch tracker reading every pitch right at mean cosine 0.96) and ship ones it refuses."""
        runtime = "TFLM interpreter" if prof.runtime == "tflite-micro" else "ai-edge-litert (XNNPACK)"
        bound, bound_from = self._max_drop(prof)
        t = res["task_score"] = self.task.judge(task_score.stack(task_got, self.ref[0]), bound, runtime, bound_from)
        if t.get("resolution") and t["passed"]:  # a failure's reason already says it
            warnings.append("WARNING: " + t["resolution"])
        res["numeric_verdict"] = {"passed": res["passed"], "reasons": res["reasons"], "decided_by": res["decided_by"]}
        nonfinite = [f"{n}: the artifact outputs NaN/inf on {m['nonfinite_samples']} of {m['samples']} samples"
                     for n, m in outputs.items() if m.get("nonfinite_samples")]
        res["reasons"] = ([] if t["passed"] else [t["reason"]]) + nonfinite
        res["passed"] = not res["reasons"]
        res["decided_by"] = [f"task {t['metric']} (drop {t['drop']:.4g}, bound {t['max_drop']:g})" if "drop" in t
                             else f"task {t['metric']}: {t['reason']}"] + nonfinite
        if res["passed"] and not res["numeric_verdict"]["passed"]:
            warnings.append(f"numeric parity alone would refuse this artifact ({res['numeric_verdict']['reasons'][0]}); "
                            f"its task {t['metric']} is within the bound (drop {t['drop']:.4g} <= {t['max_drop']:g}), "
                            "and with labels the task decides")
        return res["passed"]

    def _max_drop(self, prof: TargetProfile) -> tuple[float, str]:
        """The task drop bound for this target, in the metric's units, and where it came from."""
        return task_score.max_drop_for(prof.name, prof.max_task_drop, self.max_drop_given, self.task.metric)

    def _source(self, float_model: Artifact, precision: str) -> tuple[Artifact, str]:
        """The float32 artifact a variant derives from: the fused export, or for a `+unrolled`
        candidate (web: LiteRT.js 2.5.3 refuses variable tensors, the fused LSTM's state) the
        model exported as litert-torch lowers it, made once."""
        if not precision.endswith(UNROLLED):
            return float_model, precision
        if self._unrolled is None:
            module, work = self._unfused
            self._unrolled = Artifact(model=export_float(dataclasses.replace(self.m, module=module),
                                                         work / "float_unrolled.tflite"))
            self.notes.append("web: its artifact keeps the LSTM unrolled over time (litert-torch's lowering, "
                              "precision +unrolled): LiteRT.js 2.5.3 refuses variable tensors, the fused LSTM's state")
        return self._unrolled, precision[:-len(UNROLLED)]

    def float16_sensitivity(self) -> dict:
        """The model with float16 storage (as phone GPU delegates keep activations) against float32:
        per output cosine/max_abs, the first layer whose output is inf/NaN, and the first whose
        error exceeds FLOAT16_LOSSY (relative). Measured once per conversion."""
        if self._f16 is None:
            with torch_threads():
                self._f16 = _float16_sensitivity(self.m.module, self.samples[:LOCALIZE_SAMPLES], self.ref,
                                                 self.output_names)
        return self._f16

    def judge_elsewhere(self, prof: TargetProfile, o: ConvertOptions, art: Artifact, info: ModelInfo):
        """(judge, against PyTorch, the CPU run's outputs) for the same artifact run elsewhere
        (android-npu's HTP simulator): judged as the GPU accelerator's rows are, by this target's
        bounds against PyTorch, or with labels against the CPU run whose task score decided; the
        second judge (the first, without labels) gives the figures against PyTorch either way."""
        got = self._run_xnnpack(art.model, info)
        torch_judge = self._judge(prof, o, art)
        return (self._judge(prof, o, art, against=got) if self.task else torch_judge), torch_judge, got

    def _run_xnnpack(self, model: bytes, info: ModelInfo) -> list:
        hit = self._xnnpack.get(id(model))
        if hit is None or hit[0] is not model:
            runner = LitertRunner(model, info)
            hit = self._xnnpack[id(model)] = (model, [runner.run(s) for s in self.samples])
        return hit[1]

    def _judge(self, prof: TargetProfile, o: ConvertOptions, art: Artifact, against: list | None = None):
        """got -> (per-output figures, passed, reasons): an accelerator's outputs judged as this
        artifact's CPU run is (same bounds, overrides and float16-weight allowance); `against`
        (with labels: the CPU run's outputs, whose task score decides): judged against that run
        instead of PyTorch, by the same bounds (the same artifact: no precision allowance)."""
        def judge(got):
            if against is not None:
                outputs = self._compare(prof, o, _as_float32(against[:len(got)]), got)
                return (outputs, *parity.judge(outputs, prof, atol=o.atol, rtol=o.rtol, min_cosine=o.min_cosine))
            err = self.precision_error(art.precision)
            outputs = self._compare(prof, o, self.ref[:len(got)], got, err and [e[:len(got)] for e in err])
            return (outputs, *parity.judge(outputs, prof, atol=o.atol, rtol=o.rtol, min_cosine=o.min_cosine))
        return judge

    def _compare(self, prof: TargetProfile, o: ConvertOptions, ref, got,
                 precision_error: list[list[float]] | None = None) -> dict[str, dict]:
        return {name: parity.compare([s[k] for s in ref], [g[k] for g in got], kind=self.output_kind(k),
                                     atol=o.atol if o.atol is not None else prof.atol,
                                     rtol=o.rtol if o.rtol is not None else prof.rtol,
                                     precision_error=None if precision_error is None else precision_error[k])
                for k, name in enumerate(self.output_names)}

    def precision_error(self, precision: str) -> list[list[float]] | None:
        """Per output, per parity sample: the largest |error| that `precision` alone causes in
        PyTorch, or None where it is not emulated. float16 (weights stored in float16, computed in
        float32, as XNNPACK runs a float16-weight artifact): the model with its weights rounded to
        float16. A deep or cancelling model loses more than a fixed tolerance allows through
        rounding alone; its artifact is judged against that, not failed as a conversion error."""
        if precision != "float16":
            return None
        if self._f16_weights is None:
            m = _float16_weights(self.m.module)
            with torch.no_grad(), torch_threads():
                outs = [[t.float().numpy() for t in flatten_outputs(m(*[torch.from_numpy(x) for x in s]))]
                        for s in self.samples]
            self._f16_weights = [[float(np.abs(o[k].astype(np.float64) - r[k]).max(initial=0.0))
                                  for o, r in zip(outs, self.ref)] for k in range(len(self.ref[0]))]
        return self._f16_weights

    def _browser_parity(self, prof: TargetProfile, model: bytes, info: ModelInfo, o: ConvertOptions,
                        cpu_got: list) -> dict:
        """The web target's parity in a real browser (LiteRT.js in headless Chromium). With labels:
        the task score when the parity rows are the whole eval set; else (--samples fewer) judged
        against the task-scored CPU run's outputs, as the accelerators are."""
        reason = browser_unavailable()
        if reason:
            return {"skipped": reason}
        feed = [[to_artifact(x, t) for x, t in zip(s, info.inputs)] for s in self.samples]
        got = run_litertjs(model, feed, input_names=[t.key for t in info.inputs],
                           output_names=[t.key for t in info.outputs])
        got = [[from_artifact(y, t) for y, t in zip(row, info.outputs)] for row in got]
        outputs = self._compare(prof, o, self.ref, got)
        passed, reasons = parity.judge(outputs, prof, atol=o.atol, rtol=o.rtol, min_cosine=o.min_cosine)
        extra = {}
        if self.task is not None and self.samples is self.eval_set.rows:  # the browser ran every labelled row
            t = extra["task_score"] = self.task.judge(task_score.stack(got, self.ref[0]), self._max_drop(prof)[0],
                                                      "LiteRT.js in headless Chromium", self._max_drop(prof)[1])
            extra["numeric_verdict"] = {"passed": passed, "reasons": reasons}
            passed, reasons = t["passed"], [] if t["passed"] else [t["reason"]]
        elif self.task is not None:
            extra["numeric_verdict"] = {"passed": passed, "reasons": reasons}
            extra["outputs_vs_cpu"] = vs = self._compare(prof, o, _as_float32(cpu_got), got)
            passed, reasons = parity.judge(vs, prof, atol=o.atol, rtol=o.rtol, min_cosine=o.min_cosine)
        first = outputs[self.output_names[0]]
        return {"runtime": "LiteRT.js (@litertjs/core, wasm) in headless Chromium", "passed": passed,
                "reasons": reasons, "outputs": outputs, **extra,
                **{k: first[k] for k in ("max_abs", "rmse", "cosine", "top1") if k in first}}

    def explain_failure(self, art: Artifact, info: ModelInfo) -> dict | None:
        return parity.localize(self.m.module, self.samples[:LOCALIZE_SAMPLES], art.model, info)

    def latency(self, art: Artifact, info: ModelInfo, work: Path) -> dict:
        if self.torch_ms is None:
            with torch.no_grad(), torch_threads():
                self.torch_ms = median_ms(lambda: self.m.module(*self.m.sample_args))
        art_ms = LitertRunner(art.model, info, threads=MEASURE_THREADS).latency_ms(self.samples[0])
        return {"artifact": art_ms, "torch_eager": self.torch_ms, "threads": MEASURE_THREADS,
                "speedup_vs_torch": (self.torch_ms / art_ms) if art_ms else None,
                "runtime": "ai-edge-litert (XNNPACK)"}

    def app_ready(self, prof: TargetProfile, r: TargetResult) -> TargetResult:
        """A passed artifact made what apps load (app_io): TFLite metadata written by MediaPipe's own
        code and read back by its reader; then, with an input described, the artifact created as its
        MediaPipe task and run on the eval rows (else the parity rows) as raw data. A file the client
        refuses fails the target as a conversion error, a client score below the bound as parity.
        iot (TFLM reads no metadata) and android-npu (its compiled files) keep their artifacts."""
        if self.app is None or not r.passed or r.artifact is None or prof.runtime == "tflite-micro" or prof.npu_socs:
            return r
        clock_t = time.perf_counter()
        try:
            model, shown = app_metadata.write(r.artifact.model, self.app, r.info)
            r.artifact, r.size_bytes = dataclasses.replace(r.artifact, model=model), len(model)
            app = r.parity["app"] = {"metadata": {k: shown["json"].get(k) for k in ("name", "min_parser_version")}
                                     | {"files": shown["files"], "read_back_by": "MediaPipe MetadataDisplayer"}}
            rows = self.eval_set.rows if self.task is not None else self.samples
            texts = self.eval_set.raw if self.eval_set is not None and rows is self.eval_set.rows else None
            why = app_client.skipped_because(self.app, texts) if self.app.task is not None else None
            if why:
                app["client_skipped"] = why
                r.warnings.append(f"{prof.name}: {why}")
            elif self.app.task is not None:
                bound, bound_from = self._max_drop(prof) if self.task is not None else (0.0, "")
                app["client"] = c = app_client.check(model, r.info, self.app, rows, self.task, bound, bound_from,
                                                     web=prof.browser_parity, texts=texts)
                if not c["passed"]:
                    r.fail("parity", f"{prof.name}: {c['reason']}")
        except ConversionError as e:
            r.fail("conversion", f"{prof.name}: the app client refuses the artifact: {e}")
        r.timings_s["app_client"] = time.perf_counter() - clock_t
        return r

    def model_json(self, r: TargetResult) -> dict:
        m, info = self.m, r.info
        # info is None when the interpreter refused the artifact: its model.json still says why.
        ins = [{"name": n, **t.to_json()} for n, t in zip(m.input_names, info.inputs)] if info else []
        outs = [{"name": n, **t.to_json(), "kind": kind, "kind_source": src}
                for n, t, (kind, src) in zip(m.output_names or [], info.outputs, self.kinds)] if info else []
        return {"format": "tpu-pipeline/litert-artifact@1", "target": r.target, "passed": r.passed,
                "quantization": r.quantization, "runtime": r.runtime, "size_bytes": r.size_bytes,
                "sha256": r.sha256, "signature": "serving_default", "inputs": ins, "outputs": outs,
                "task": m.task, "notes": self.notes, "parity": r.parity, "latency_ms": r.latency_ms,
                "errors": r.errors, "warnings": r.warnings, "firmware": r.firmware,
                **({"app": app_json(self.app, info, (r.parity or {}).get("app"))} if self.app else {})}

    def report_fields(self) -> dict:
        m = self.m
        return {"source_format": m.source_format, "task": m.task,
                "inputs": [{"name": n, "shape": list(a.shape), "dtype": str(a.dtype).replace("torch.", "")}
                           for n, a in zip(m.input_names, m.sample_args)],
                "output_names": m.output_names, "samples": len(self.samples), "sample_source": self.sample_source,
                "output_kinds": {n: {"kind": kind, "source": src} for n, (kind, src) in zip(self.output_names, self.kinds)},
                **({"task_score": self._task_fields()} if self.task is not None else {}), "notes": self.notes}

    def _task_fields(self) -> dict:
        t = self.task
        return {"metric": t.metric.name, "chosen": t.metric.why, "higher_is_better": t.metric.higher_is_better,
                "unit": t.metric.unit,
                "rows": len(t.labels), "labels_from": self.eval_set.source, "torch_score": t.torch_score,
                "torch_interval": t.torch_interval}


# After failing in the profile's arena TFLM is retried in doubling arenas up to this: a node that
# fails to prepare in the budget may only lack memory (the true reason is then the size), or fail
# at any size (the op)
LARGEST_ARENA = 64 * 1024 * 1024
_NODE = re.compile(r"Node (\w+) \(number (\d+)\)")


def _run_micro(model: bytes, info: ModelInfo, rows: list, prof: TargetProfile) -> list:
    """The rows through TFLM in the profile's arena. A failure there is retried on one row in arenas
    doubling up to LARGEST_ARENA, so the refusal gives the true reason (issue 30: "FULLY_CONNECTED
    failed to prepare" at 256 KiB, then a CONCATENATION at 1 and 4 MiB): the arena the model runs in
    when a larger one does, else the op that fails at every size, with its inputs' count and dtypes."""
    budget = prof.max_arena_bytes or LARGEST_ARENA
    try:
        return run_micro(model, info, rows, budget)
    except ConversionError as first:
        if not re.search(r"prepare|allocate|arena", str(first).split("):", 1)[-1], re.I):
            raise  # a crash or a timeout: a larger arena would not change it
        failure, arena, failed_in = first, budget * 2, budget
        while arena <= LARGEST_ARENA:
            try:
                run_micro(model, info, rows[:1], arena)
            except ConversionError as e:
                failure, failed_in, arena = e, arena, arena * 2
                continue
            raise ConversionError(f"TFLM needs a larger tensor arena than the {prof.name} budget of {budget} bytes: "
                                  f"it runs in {arena} and fails in {failed_in} bytes; the graph has {len(info.ops)} "
                                  f"ops (in the budget: {first})") from None
        raise ConversionError(_describe_node(str(failure), info)) from None


def _describe_node(msg: str, info: ModelInfo) -> str:
    """TFLM's failure with the failing node's inputs (count, dtypes, shapes) added."""
    m = _NODE.search(msg)
    if not m or int(m.group(2)) >= len(info.ops):
        return msg
    op = info.ops[int(m.group(2))]
    if op["op"] != m.group(1):
        return msg
    ins = [info.tensors[i] for i in op["inputs"] if i >= 0 and i in info.tensors]
    dtypes = "/".join(sorted({t["dtype"] for t in ins}))
    shapes = ", ".join(str(list(t["shape"])) for t in ins[:4]) + (", ..." if len(ins) > 4 else "")
    return (f"{msg} (at every arena up to {LARGEST_ARENA} bytes; node {m.group(2)}: {op['op']} with {len(ins)} "
            f"{dtypes} inputs {shapes})")


def _as_float32(rows: list) -> list[list[np.ndarray]]:
    """A runtime's outputs per row as float32 arrays: a reference for another runtime's."""
    return [[np.asarray(y, np.float32) for y in row] for row in rows]


def _to_f16(t):
    """A float tensor rounded to float16 and back (values beyond float16's range become inf)."""
    return t.half().float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t


def _float16_weights(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of `module` with every float parameter and buffer rounded to float16 (kept float32)."""
    m = copy.deepcopy(module)
    with torch.no_grad():
        for p in list(m.parameters()) + list(m.buffers()):
            if p.is_floating_point():
                p.copy_(_to_f16(p))
    return m


def _float16_run(module: torch.nn.Module, args) -> tuple[list[torch.Tensor], dict[str, np.ndarray]]:
    """The model with float16 storage emulated: weights, inputs and every layer's output rounded to
    float16, arithmetic in float32 (PyTorch's float16 CPU kernels are too slow to run here; phone
    GPU delegates store activations in float16). -> (outputs, each layer's rounded output)."""
    m = _float16_weights(module)
    acts: dict[str, np.ndarray] = {}
    args = [_to_f16(a) for a in args]
    if isinstance(m, torch.fx.GraphModule) and any(n.meta.get("nn_module_stack") for n in m.graph.nodes):
        class Rounding(torch.fx.Interpreter):
            def run_node(self, n):
                out = super().run_node(n)
                if n.op != "call_function" or not isinstance(out, torch.Tensor) or not out.is_floating_point():
                    return out
                out = _to_f16(out)
                for path, _type in (n.meta.get("nn_module_stack") or {}).values():
                    acts[parity.stack_path(path)] = out.numpy()
                return out

        with torch.no_grad():
            out = Rounding(m).run(*args)
        return flatten_outputs(out), acts

    def hook(_m, _i, out, name):
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            out = _to_f16(out)
            acts[name] = out.numpy()
            return out
        return None

    hs = [sub.register_forward_hook(lambda mod, i, o, name=name: hook(mod, i, o, name))
          for name, sub in m.named_modules() if name]
    try:
        with torch.no_grad():
            out = m(*args)
    finally:
        for h in hs:
            h.remove()
    return [_to_f16(t) for t in flatten_outputs(out)], acts


def _float16_sensitivity(module: torch.nn.Module, samples, ref, names) -> dict:
    bad: dict[str, str] = {}
    rel: dict[str, float] = {}
    order: list[str] = []
    outs = []
    try:
        for s in samples:
            args = [torch.from_numpy(np.asarray(x)) for x in s]
            want = parity.activations(module, args)
            got_out, got = _float16_run(module, args)
            for name, g in got.items():  # execution order
                if name not in want:
                    continue
                order += [name] if name not in order else []
                if not np.isfinite(g).all():
                    bad.setdefault(name, "inf" if np.isinf(g).any() else "NaN")
                else:
                    w = want[name].astype(np.float64)
                    # sums, not np.linalg.norm: BLAS threads spin on a shared machine (3 s for 144 norms here)
                    norm = np.sqrt((w * w).sum())
                    diff = float(np.sqrt(((g - w) ** 2).sum()))
                    err = diff / norm if norm > 0 else float(np.abs(g).max(initial=0) > 0)
                    rel[name] = max(rel.get(name, 0.0), err)
            outs.append([t.numpy() for t in got_out])
    except Exception as e:  # noqa: BLE001 - a graph the emulation cannot run: say so, judge nothing
        return {"measured": False, "why": f"{type(e).__name__}: {first_line(e)}"}
    per_output = {}
    for k, name in enumerate(names):
        g = [o[k] for o in outs]
        m = parity.compare([r[k] for r in ref[:len(g)]], [np.nan_to_num(x) for x in g], classifier=False)
        per_output[name] = {"finite": bool(all(np.isfinite(x).all() for x in g)), "cosine": m["cosine"],
                            "max_abs": m["max_abs"]}
    first_bad = next((n for n in order if n in bad), None)
    if first_bad is None:
        first_bad = next((f"output {n}" for n, v in per_output.items() if not v["finite"]), None)
    lossy = next((n for n in order if rel.get(n, 0.0) > FLOAT16_LOSSY), None)
    return {"measured": True, "runtime": "PyTorch, float16 storage emulated (weights, inputs and each layer's output "
            "rounded to float16; arithmetic in float32)", "outputs": per_output,
            "first_nonfinite": (f"{first_bad} ({bad[first_bad]})" if first_bad in bad else first_bad),
            "first_lossy": f"{lossy} (relative error {rel[lossy]:.3g})" if lossy else None, "layers_seen": len(order)}


def _app_graph(m: LoadedModel, o: ConvertOptions) -> tuple[LoadedModel, AppIO | None]:
    """The options' and the loader's input description (app_io), checked against the model, and
    the model as apps feed it (graph.app_graph: NHWC image input, softmax head); (m, None) when
    nothing is described."""
    with torch.no_grad(), torch_threads():
        outs = flatten_outputs(m.module(*m.sample_args))
    app = describe(image=o.image, audio=o.audio, text=o.text, labels=o.labels, info=o.metadata, given=m.app_io,
                   input_names=m.input_names, input_shapes=[tuple(a.shape) for a in m.sample_args],
                   input_dtypes=[str(a.dtype).replace("torch.", "") for a in m.sample_args],
                   output_shapes=[tuple(t.shape) for t in outs])
    if app is None:
        return m, None
    if "name" not in app.info:  # the metadata's model name: the class a manifest names (a .pt2: "model")
        name = type(m.module).__name__
        app = dataclasses.replace(app, info={**app.info, "name": "model" if name == "GraphModule" else name})
    module, notes = app_graph(m.module, m.input_names, app, outs[0].float().numpy())
    args = to_app([[a.numpy() for a in m.sample_args]], m.input_names, app)[0]
    return dataclasses.replace(m, module=module, sample_args=tuple(torch.from_numpy(a) for a in args),
                               notes=[*m.notes, *notes]), app


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
    """-> (parity samples, where they came from, calibration rows). Real data beats random, and a
    parity row is never a calibration row: one that set the int8 ranges flatters the artifact.
    n None (the default): every --eval-data row; else DEFAULT_SAMPLES (64) rows. With n given and
    more rows than n, n are drawn with `rng` (--seed redraws them). Calibration rows alone: n drawn
    and held out when there are 2n, else half of them (calibration keeps the rest); a single row
    cannot be split: it is both, and `calibration_overlap` says so on the report (prepare)."""
    if eval_data:
        if n is None or n >= len(eval_data):
            return eval_data, f"--eval-data (all {len(eval_data)} rows)", calib_data
        pick = sorted(rng.choice(len(eval_data), n, replace=False).tolist())
        return [eval_data[i] for i in pick], f"--eval-data ({n} of {len(eval_data)} rows, drawn)", calib_data
    n = DEFAULT_SAMPLES if n is None else n
    if calib_data:
        if len(calib_data) < 2:
            return (list(calib_data), f"{calib_source} (1 row, also used for calibration: too few rows to hold "
                    "any out; give more rows or --eval-data)", calib_data)
        k = n if len(calib_data) >= 2 * n else len(calib_data) // 2
        held = set(rng.choice(len(calib_data), k, replace=False).tolist())
        samples = [r for i, r in enumerate(calib_data) if i in held]
        # a row given twice stays out of calibration too (the split is by content, not position)
        seen = {_row_key(r) for r in samples}
        kept = [r for i, r in enumerate(calib_data) if i not in held and _row_key(r) not in seen]
        if not kept:  # every row is a copy of a held-out one: nothing distinct left to calibrate on
            return (list(calib_data), f"{calib_source} ({len(calib_data)} rows, all alike: also used for "
                    "calibration)", calib_data)
        if k == n:
            return samples, f"{calib_source} ({n} rows drawn, held out of calibration)", kept
        return samples, (f"{calib_source} ({k} of {len(calib_data)} rows drawn and held out of calibration, "
                         f"which keeps {len(kept)}: fewer than {2 * n} rows, so half are parity rows; give more "
                         "rows or --eval-data for more)"), kept
    first = [a.numpy() for a in m.sample_args]
    return [first] + [_random_sample(m, rng) for _ in range(n - 1)], "the model's example inputs + random inputs", None


def _row_key(row) -> tuple:
    """A row's content, for telling identical rows apart from distinct ones."""
    return tuple((np.asarray(a).dtype.str, np.shape(a), np.asarray(a).tobytes()) for a in row)


def _calibration_overlap(samples, calib) -> dict | None:
    """How many parity rows are also calibration rows (None when none is): on the parity record
    of every calibrated (static int8) artifact, since its verdict on those rows is flattered."""
    keys = {_row_key(r) for r in calib or []}
    shared = sum(_row_key(r) in keys for r in samples)
    if not shared:
        return None
    return {"rows": shared, "of": len(samples),
            "why": f"{shared} of {len(samples)} parity rows are also calibration rows (too few distinct rows to "
                   "keep them apart): the int8 verdict on them is flattered; give more rows or --eval-data"}


def _sample_rows(rows, m: LoadedModel) -> list[list[np.ndarray]]:
    """calibration= rows (each a tensor or a tuple of tensors/arrays, one per input, batch 1
    like the sample inputs) -> numpy rows checked against the sample inputs' shapes."""
    out = []
    for i, row in enumerate(rows):
        row = (row,) if isinstance(row, (torch.Tensor, np.ndarray)) else tuple(row)
        if len(row) != len(m.sample_args):
            raise UserError(f"calibration row {i}: {len(row)} inputs; the model takes {len(m.sample_args)}")
        arrays = []
        for x, a in zip(row, m.sample_args):
            x = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
            if tuple(x.shape) != tuple(a.shape):
                raise UserError(f"calibration row {i}: shape {list(x.shape)}; expected {list(a.shape)}")
            arrays.append(x.astype(str(a.dtype).replace("torch.", "")))
        out.append(arrays)
    if not out:
        raise UserError("calibration holds no rows")
    return out


def _rows(tensors: list[torch.Tensor], m: LoadedModel) -> list[list[np.ndarray]]:
    arrays = [t.detach().cpu().to(a.dtype).numpy() for t, a in zip(tensors, m.sample_args)]
    n = min(len(a) for a in arrays)
    if n == 0:
        raise UserError("calibration_inputs holds no rows")
    return [[a[i:i + 1] for a in arrays] for i in range(n)]


def _input_specs(m: LoadedModel) -> list[eval_data.InputSpec]:
    return [eval_data.InputSpec(name, tuple(a.shape), str(a.dtype).replace("torch.", ""))
            for name, a in zip(m.input_names, m.sample_args)]


def _read_npz(path, m: LoadedModel, flag: str) -> list[list[np.ndarray]]:
    """An .npz with one array per input (named like the input, or arr_0..): shape (N, *input_shape[1:]),
    or a samples folder (convert/verdict/eval_data.py); --calib ignores labels."""
    return eval_data.read(path, _input_specs(m), flag).rows


def _without_rows(calib, held, calib_source) -> tuple[list, str | None]:
    """Calibration rows minus any row identical to a parity (--eval-data) row: a row that set the
    int8 ranges would flatter the artifact measured on it. -> (rows kept, the report's note)."""
    seen = {_row_key(r) for r in held}
    kept = [r for r in calib if _row_key(r) not in seen]
    if len(kept) == len(calib):
        return calib, None
    if not kept:
        raise UserError(f"every row of {calib_source} ({len(calib)}) is also an --eval-data row: calibration and "
                        "evaluation rows must differ (give calibration rows apart from the eval set)")
    return kept, (f"calibration: {len(calib) - len(kept)} of {len(calib)} rows of {calib_source} are also --eval-data "
                  "rows and were left out of calibration (parity and calibration rows never overlap)")


def _dtype_notes(m: LoadedModel, info: ModelInfo) -> list[str]:
    notes = []
    for name, a, t in zip(m.input_names, m.sample_args, info.inputs):
        src = str(a.dtype).replace("torch.", "")
        if src != t.dtype and not (t.scale and t.dtype == "int8"):
            notes.append(f"input {name}: {src} in PyTorch is {t.dtype} in the artifact; feed {t.dtype} (parity did)")
    return notes
