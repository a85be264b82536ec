"""Parity on the accelerators apps pick: LiteRT's GPU accelerator (android) and
LiteRT.js's WebGPU backend (web), each beside the CPU run the target always has.

On a host without a GPU both run on Chromium's SwiftShader (Vulkan on the CPU),
which computes in float32: these checks prove the accelerator takes the graph
(fully, or which ops fall back to the CPU) and that its kernels compute the
model; a phone GPU's float16 arithmetic is a separate check (the float16
emulation in PyTorch, `float16_activations`), and each record says which it is.

A profile asks with `gpu_accelerator` / `webgpu` = off | try | require. An
accelerator that cannot start is "not done" with its reason, never a pass:
`require` fails the target, `try` warns (fail closed, as the delegate check)."""

from __future__ import annotations

import concurrent.futures
from typing import Callable

import numpy as np

from tpu_pipeline.convert.runtimes import overlap
from tpu_pipeline.convert.runtimes.browser import browser_unavailable, run_litertjs_on
from tpu_pipeline.convert.runtimes.litert import GPU_RUNTIME, GpuRun, Sample, from_artifact, run_gpu, to_artifact
from tpu_pipeline.convert.targets import TargetProfile
from tpu_pipeline.convert.tflite_info import ModelInfo
from tpu_pipeline.convert.verdict import checks
from tpu_pipeline.errors import ConversionError

# got (outputs per sample, in PyTorch's terms) -> (per-output figures, passed, reasons it failed),
# with the bounds and option overrides the target's CPU parity uses
Judge = Callable[[list[list[np.ndarray]]], tuple[dict[str, dict], bool, list[str]]]

GPU_CHECK = ("GPU accelerator run: the artifact on LiteRT's GPU accelerator (CompiledModel, "
             "GPU with the CPU as fallback, as apps compile); on SwiftShader (no GPU here) float32 arithmetic, not the phone's float16 numerics, "
             "which float16_activations emulates")
WEBGPU_CHECK = ("WebGPU run: the artifact on LiteRT.js's WebGPU backend in headless Chromium; on SwiftShader (no GPU "
                "here) float32 arithmetic, not a phone GPU's float16 numerics")
FLOAT16_CHECK = ("float16 emulation: PyTorch with float16 storage (weights, inputs, each layer's output), as a "
                 "phone GPU keeps activations; judges the phone's precision, not the accelerator's kernels")
FIGURES = ("max_abs", "rmse", "cosine", "cosine_mean", "top1")


ACCELERATOR_SAMPLES = 8  # shaders compile in seconds on SwiftShader, then ~0.3 s a sample on a small CNN:
# a few rows prove the kernels and their coverage (the numerics are float32, as the CPU run's)


class Pending:
    """The accelerator runs `prof` asks for on `model`, started at once in the background: each is
    a child process (the GPU worker, Chromium), so the parity work of the parent and the runs
    overlap on the two cores. `fold` waits for them and adds their records to a parity result."""

    def __init__(self, prof: TargetProfile, model: bytes, info: ModelInfo, samples: list[Sample]):
        self.prof, self.model, self.info = prof, model, info
        self.samples = samples[:ACCELERATOR_SAMPLES]
        want_gpu = prof.gpu_accelerator != "off" and prof.runtime != "tflite-micro"
        want_webgpu = prof.browser_parity and prof.webgpu != "off"
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="tpp-accelerator")
        self.gpu = self._pool.submit(run_gpu, model, info, self.samples) if want_gpu else None
        self.webgpu = self._pool.submit(_run_webgpu, model, info, self.samples) if want_webgpu else None
        self._pool.shutdown(wait=False)

    def fold(self, res: dict, warnings: list[str], judge: Judge, cpu_got: list[list[np.ndarray]]) -> None:
        cpu_got = cpu_got[:len(self.samples)]
        with overlap.waiting():  # the children still compiling or running: the next target's turn meanwhile
            concurrent.futures.wait([f for f in (self.gpu, self.webgpu) if f is not None])
        if self.gpu is not None:
            res["gpu_accelerator"] = rec = self._gpu_record(_result(self.gpu), judge, cpu_got)
            apply(rec, res, warnings, required=self.prof.gpu_accelerator == "require", label="GPU accelerator")
        if self.webgpu is not None:
            res["webgpu"] = rec = self._webgpu_record(_result(self.webgpu), judge, cpu_got)
            apply(rec, res, warnings, required=self.prof.webgpu == "require", label="WebGPU backend (LiteRT.js)")

    def _gpu_record(self, run: GpuRun | str, judge: Judge, cpu_got) -> dict:
        """The android check: the artifact on LiteRT's GPU accelerator, judged by the profile's bounds."""
        rec = {"check": GPU_CHECK, "runtime": GPU_RUNTIME, "requested": self.prof.gpu_accelerator,
               "samples": len(self.samples), "started": False, "done": False}
        if isinstance(run, str):
            return {**rec, "reason": run}
        rec.update(started=run.started, vulkan_icd=run.vulkan_icd, adapter=run.adapter,
                   fully_accelerated=run.fully_accelerated)
        if run.started and run.fully_accelerated is False:
            if run.fallback_ops:  # the accelerator's own words, as it compiled the model
                rec.update(fallback_ops=sorted({x.split(":")[0] for x in run.fallback_ops}),
                           fallback_ops_by="LiteRT GPU delegate (compile log)", fallback_detail=run.fallback_ops,
                           split=run.split)
            else:
                rec.update(_fallback_ops(self.model, self.info))
        if run.outputs is None:
            return {**rec, "reason": run.reason}
        return _judged(rec, judge, run.outputs, cpu_got)

    def _webgpu_record(self, run: tuple | str, judge: Judge, cpu_got) -> dict:
        """The web check beside wasm: the artifact on LiteRT.js's WebGPU backend in headless Chromium."""
        rec = {"check": WEBGPU_CHECK, "runtime": "LiteRT.js (@litertjs/core, webgpu) in headless Chromium",
               "requested": self.prof.webgpu, "samples": len(self.samples), "started": False, "done": False}
        if isinstance(run, str):
            return {**rec, "reason": run}
        got, ran = run
        rec.update(started=True, adapter=ran["adapter"], fully_accelerated=ran["fully_accelerated"])
        if ran["accelerator"] != "webgpu":
            # LiteRT.js recompiled for wasm: the numbers would be wasm's, so the WebGPU check is not done
            rec.update(_fallback_ops(self.model, self.info))
            return {**rec, "reason": f"LiteRT.js fell back to {ran['accelerator']}: the model is not fully "
                                     "accelerated on WebGPU and this browser lacks JSPI for a partial delegation"}
        if ran["fully_accelerated"] is False:
            rec.update(_fallback_ops(self.model, self.info))
        got = [[from_artifact(y, t) for y, t in zip(row, self.info.outputs)] for row in got]
        return _judged(rec, judge, got, cpu_got)


def _run_webgpu(model: bytes, info: ModelInfo, samples: list[Sample]) -> tuple | str:
    """(outputs, what ran) from LiteRT.js's WebGPU backend, or why it did not run."""
    why = browser_unavailable()
    if why:
        return why
    feed = [[to_artifact(x, t) for x, t in zip(s, info.inputs)] for s in samples]
    try:
        return run_litertjs_on("webgpu", model, feed, input_names=[t.key for t in info.inputs],
                               output_names=[t.key for t in info.outputs])
    except ConversionError as e:
        return str(e)


def _result(future: concurrent.futures.Future):
    """The run's result, or a reason: an accelerator that fails in a way nobody foresaw is a check
    not done, never a crash of the conversion."""
    try:
        return future.result()
    except Exception as e:  # noqa: BLE001 - reported as the check's reason (fail closed)
        return f"{type(e).__name__}: {str(e).strip()[:300]}"


def apply(rec: dict, res: dict, warnings: list[str], *, required: bool, label: str) -> None:
    """Folds an accelerator record into a parity result: a mismatch fails the target; a check not
    done fails it when `required`, else warns; a partial acceleration warns (require_delegate
    fails it in the compatibility checks, where the op coverage is judged)."""
    if rec["done"]:
        if not rec["passed"]:
            res["passed"] = False
            res["reasons"] += [f"on the {label}: {x}" for x in rec["reasons"]]
    else:
        msg = f"{label} check not done: {rec['reason']}"
        if required:
            res["passed"] = False
            res["reasons"].append(msg + " (the target profile requires it)")
        else:
            warnings.append("WARNING: " + msg)
    if rec.get("fully_accelerated") is False:
        ops = rec.get("fallback_ops")
        warnings.append(f"the {label} does not run the whole graph: "
                        + (f"{', '.join(ops)} fall back to the CPU" if ops else "some ops fall back to the CPU "
                           "(the accelerator does not name them; the model analyzer flags none)"))


def _judged(rec: dict, judge: Judge, got, cpu_got) -> dict:
    outputs, passed, reasons = judge(got)
    first = next(iter(outputs.values()))
    rec.update(done=True, passed=passed, reasons=reasons, outputs=outputs,
               **{k: first[k] for k in FIGURES if k in first},
               max_abs_vs_cpu=float(max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max(initial=0.0)
                                        for g, c in zip(got, cpu_got) for a, b in zip(g, c))))
    return rec


def _fallback_ops(model: bytes, info: ModelInfo) -> dict:
    """The ops that fall back to the CPU, as LiteRT's model analyzer names them (the accelerator
    itself only says whether the whole graph is taken)."""
    flagged, why = checks.gpu_analyzer_warnings(model)
    if why:
        return {"fallback_ops": None, "fallback_ops_by": why}
    return {"fallback_ops": sorted({op["op"] for op in info.ops if op["index"] in set(flagged)}),
            "fallback_ops_by": "LiteRT model analyzer (gpu_compatibility)"}
