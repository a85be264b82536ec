"""Runs an artifact on a target's runtime: ai-edge-litert (XNNPACK, or the
reference kernels), LiteRT's GPU accelerator (in a child process; run_gpu) or
the real TFLM interpreter. Inputs are given and outputs
returned as float/int numpy arrays in PyTorch's terms: quantized I/O is
(de)quantized here with the tensor's scale and zero point, int64 inputs are
fed as the int32 the artifact declares."""

from __future__ import annotations

import contextlib
import ctypes.util
import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Iterator

import numpy as np
from ai_edge_litert.interpreter import Interpreter, OpResolverType

from tpu_pipeline.convert.runtimes import overlap
from tpu_pipeline.convert.tflite_info import IOTensor, ModelInfo
from tpu_pipeline.errors import ConversionError

Sample = list[np.ndarray]  # one array per model input, in forward() order
logger = logging.getLogger(__name__)


def to_artifact(x: np.ndarray, t: IOTensor) -> np.ndarray:
    if t.dtype in ("int8", "uint8", "int16") and t.scale:
        info = np.iinfo(t.dtype)
        q = np.round(x.astype(np.float32) / t.scale) + t.zero_point
        return np.clip(q, info.min, info.max).astype(t.dtype)
    return np.asarray(x).astype(t.dtype)


def from_artifact(y: np.ndarray, t: IOTensor) -> np.ndarray:
    if t.dtype in ("int8", "uint8", "int16") and t.scale:
        return (y.astype(np.float32) - t.zero_point) * t.scale
    return np.asarray(y)


# The reference kernels lack some op versions the converter emits (int32 ABS v5 from a reflect
# pad); the interpreter then refuses the whole model with this message.
_MISSING_OP = re.compile(r"Didn't find (?:op for builtin opcode|custom op for name) '([^']+)'(?: version '(\d+)')?")
REFERENCE_KERNELS = "reference kernels (BUILTIN_REF)"
BUILTIN_KERNELS = "builtin optimized kernels (default resolver without XNNPACK)"


class LitertRunner:
    """ai-edge-litert Interpreter; `reference=True` uses the reference kernels (no XNNPACK).

    Where the reference kernels lack an op version, the runner falls back to the builtin
    optimized kernels (the default resolver, XNNPACK left out so the check still compares
    two kernel sets): `kernels` names what ran, `fallback` says why (None when no fallback).
    An artifact the interpreter refuses is a ConversionError naming the reason."""

    def __init__(self, model: bytes, info: ModelInfo, *, reference: bool = False, preserve_all: bool = False,
                 threads: int = 1):
        self.info = info
        self.kernels = REFERENCE_KERNELS if reference else "XNNPACK (default resolver)"
        self.fallback: str | None = None
        kind = OpResolverType.BUILTIN_REF if reference else OpResolverType.AUTO
        try:
            self.interp = _interpreter(model, kind, threads, preserve_all)
        except ValueError as e:
            missing = _MISSING_OP.search(str(e))
            if not (reference and missing):
                raise ConversionError(f"ai-edge-litert cannot load the artifact: {_first(e)}") from None
            op = missing.group(1) + (f" v{missing.group(2)}" if missing.group(2) else "")
            try:
                self.interp = _interpreter(model, OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES, threads,
                                           preserve_all)
            except ValueError as e2:
                raise ConversionError(f"ai-edge-litert cannot load the artifact: {_first(e2)}") from None
            self.kernels = BUILTIN_KERNELS
            self.fallback = f"the reference kernels lack {op}; ran on the {BUILTIN_KERNELS} instead"

    def run(self, sample: Sample) -> list[np.ndarray]:
        for x, t in zip(sample, self.info.inputs):
            self.interp.set_tensor(t.tensor_index, to_artifact(x, t))
        self.interp.invoke()
        return [from_artifact(self.interp.get_tensor(t.tensor_index), t) for t in self.info.outputs]

    def tensor(self, index: int) -> np.ndarray:
        return self.interp.get_tensor(index)

    def latency_ms(self, sample: Sample, budget_s: float = 0.25) -> float:
        """Median of at least 5 and at most 50 invokes, stopping once `budget_s` is spent."""
        for x, t in zip(sample, self.info.inputs):
            self.interp.set_tensor(t.tensor_index, to_artifact(x, t))
        self.interp.invoke()
        times: list[float] = []
        while len(times) < 5 or (sum(times) < budget_s and len(times) < 50):
            t0 = time.perf_counter()
            self.interp.invoke()
            times.append(time.perf_counter() - t0)
        return float(np.median(times) * 1e3)


def _interpreter(model: bytes, kind: OpResolverType, threads: int, preserve_all: bool) -> Interpreter:
    with warnings.catch_warnings():
        # preserve_all on the builtin kernels warns "for debugging purposes only": localization is that
        warnings.simplefilter("ignore", UserWarning)
        interp = Interpreter(model_content=model, num_threads=threads, experimental_op_resolver_type=kind,
                             experimental_preserve_all_tensors=preserve_all)
    interp.allocate_tensors()
    return interp


def _first(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def run_micro(model: bytes, info: ModelInfo, samples: list[Sample], arena_bytes: int) -> list[list[np.ndarray]]:
    """All samples through TFLM in one child process; a crash becomes a ConversionError."""
    worker = Path(__file__).parents[1] / "iot" / "_micro_worker.py"  # by file: the child needs none of tpu_pipeline
    with tempfile.TemporaryDirectory(prefix="tpu-pipeline-tflm-") as d:
        d = Path(d)
        (d / "model.tflite").write_bytes(model)
        feed = {}
        for s, sample in enumerate(samples):
            for x, t in zip(sample, info.inputs):
                feed[f"in_{t.position}_{s}"] = to_artifact(x, t)
        np.savez(d / "in.npz", **feed)
        env = dict(os.environ, PYTHONPATH="")
        with overlap.waiting():  # TFLM works in its child: the next target's turn meanwhile
            proc = subprocess.run([sys.executable, str(worker), str(d / "model.tflite"), str(d / "in.npz"),
                                   str(d / "out.npz"), str(arena_bytes), str(len(info.outputs))],
                                  capture_output=True, text=True, timeout=600, env=env)
        if proc.returncode != 0 or not (d / "out.npz").exists():
            lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
            # TFLM prints its own reason (arena, missing op) before dying; Python's traceback is noise.
            tflm = [ln for ln in lines if re.search(r"fail|error|missing|didn't|unsupported|not found", ln, re.I)
                    and not ln.startswith(("File ", "Traceback"))]
            msg = "; ".join(tflm[-2:])[:400] if tflm else child_reason(proc.stdout + proc.stderr, proc.returncode)
            raise ConversionError(f"TFLM interpreter failed (arena {arena_bytes} bytes): {msg}")
        data = np.load(d / "out.npz")
        by_pos = {t.position: t for t in info.outputs}
        results = []
        for s in range(len(samples)):
            outs = [None] * len(info.outputs)
            for k, t in enumerate(info.outputs):
                outs[k] = from_artifact(data[f"out_{t.position}_{s}"], by_pos[t.position])
            results.append(outs)
        return results


# LiteRT's GPU accelerator (ML Drift over WebGPU/Dawn) needs a Vulkan driver Dawn accepts. On a
# host without a GPU that is Chromium's SwiftShader (Vulkan on the CPU, float32 arithmetic);
# Debian's Mesa lavapipe is refused by Dawn. Checked 2026-12-01 with ai-edge-litert 2.3.
SWIFTSHADER_ICD = Path("/usr/lib/chromium/vk_swiftshader_icd.json")
GPU_TIMEOUT_S = 300.0
GPU_RUNTIME = "LiteRT GPU accelerator (CompiledModel, ML Drift over WebGPU/Dawn)"


@dataclasses.dataclass(kw_only=True)
class GpuRun:
    """One artifact on LiteRT's GPU accelerator. started False: `reason` says why it did not start
    (no outputs). started True: `fully_accelerated`, and `outputs` per sample unless `reason` says
    the run failed."""

    started: bool
    reason: str | None = None
    fully_accelerated: bool | None = None
    outputs: list[list[np.ndarray]] | None = None
    adapter: str | None = None      # the Vulkan device Dawn picked, from LiteRT's log
    fallback_ops: list[str] | None = None  # "OP: why" for each op the GPU left to the CPU, from LiteRT's log
    split: str | None = None        # LiteRT's own count: "N operations will run on the GPU, ... on the CPU"
    vulkan_icd: str | None = None   # the driver manifest given to the Vulkan loader


def gpu_environment() -> tuple[dict[str, str], str | None]:
    """The child's environment for the GPU accelerator, or a reason it cannot start here. A
    VK_ICD_FILENAMES the user set is kept (their driver); otherwise Chromium's SwiftShader."""
    env = dict(os.environ, PYTHONPATH="")
    if ctypes.util.find_library("vulkan") is None:
        return env, "no Vulkan loader (libvulkan.so.1): apt-get install libvulkan1 (`make browser` does)"
    if not env.get("VK_ICD_FILENAMES"):
        if not SWIFTSHADER_ICD.exists():
            return env, (f"no Vulkan driver the accelerator accepts: Chromium's SwiftShader ({SWIFTSHADER_ICD}) "
                         "is missing (apt-get install chromium, `make browser`), or set VK_ICD_FILENAMES")
        env["VK_ICD_FILENAMES"] = str(SWIFTSHADER_ICD)
    return env, None


class _GpuWorker:
    """One gpu_worker.py child started before its job is known (it imports ai-edge-litert
    meanwhile) and given the job's paths on stdin; it runs one job and exits."""

    def __init__(self, env: dict[str, str]):
        self.dir = Path(tempfile.mkdtemp(prefix="tpu-pipeline-gpu-"))
        runtime_dir = self.dir / "xdg"  # Dawn/Vulkan want a private, writable XDG_RUNTIME_DIR
        runtime_dir.mkdir(mode=0o700)
        self.env = {**env, "XDG_RUNTIME_DIR": str(runtime_dir)}
        worker = Path(__file__).parent / "gpu_worker.py"  # by file: the child needs none of tpu_pipeline
        self.proc = subprocess.Popen([sys.executable, str(worker)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=self.env)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()
        shutil.rmtree(self.dir, ignore_errors=True)


_ahead: list[_GpuWorker] = []  # workers started by gpu_worker_ahead(), not yet given a job


@contextlib.contextmanager
def gpu_worker_ahead() -> Iterator[None]:
    """Starts one GPU worker now, so that its start-up (a Python, ai-edge-litert's import) runs
    while the caller exports; the first run_gpu inside the block takes it. One not taken is
    stopped on the way out, on an error or an interrupt too. Nothing starts where the
    accelerator cannot (run_gpu then says why)."""
    env, why = gpu_environment()
    if why:
        yield
        return
    w = _GpuWorker(env)
    _ahead.append(w)
    try:
        yield
    finally:
        if w in _ahead:
            _ahead.remove(w)
            w.close()


def _take_worker(env: dict[str, str]) -> _GpuWorker:
    """The worker started ahead, if one is waiting with this environment, else a new one."""
    for w in list(_ahead):
        if {k: v for k, v in w.env.items() if k != "XDG_RUNTIME_DIR"} == env:
            with contextlib.suppress(ValueError):
                _ahead.remove(w)
                return w
    return _GpuWorker(env)


def run_gpu(model: bytes, info: ModelInfo, samples: list[Sample], *, timeout: float = GPU_TIMEOUT_S) -> GpuRun:
    """All samples through LiteRT's GPU accelerator in one child process (gpu_worker.py):
    a driver that crashes or hangs becomes a reason, never an exception or a hang here."""
    env, why = gpu_environment()
    icd = env.get("VK_ICD_FILENAMES")
    if why:
        return GpuRun(started=False, reason=why, vulkan_icd=icd)
    worker = _take_worker(env)
    try:
        return _run_on(worker, model, info, samples, timeout, icd)
    finally:
        worker.close()


def _run_on(worker: _GpuWorker, model: bytes, info: ModelInfo, samples: list[Sample], timeout: float,
            icd: str | None) -> GpuRun:
    d = worker.dir
    (d / "model.tflite").write_bytes(model)
    (d / "job.json").write_text(json.dumps({"signature": "serving_default",
                                            "inputs": [t.key for t in info.inputs],
                                            "outputs": [t.key for t in info.outputs]}))
    np.savez(d / "in.npz", **{f"in_{i}_{s}": to_artifact(x, t) for s, sample in enumerate(samples)
                              for i, (x, t) in enumerate(zip(sample, info.inputs))})
    paths = [str(d / n) for n in ("model.tflite", "job.json", "in.npz", "out.npz", "status.json")]
    try:
        log, _ = worker.proc.communicate(json.dumps(paths) + "\n", timeout=timeout)
        code = worker.proc.returncode
    except subprocess.TimeoutExpired as e:
        log, code = _text(e.stdout), None
    status = json.loads((d / "status.json").read_text()) if (d / "status.json").exists() else {}
    adapter = re.search(r"Selected adapter: ([^,\n]+)", log)
    run = GpuRun(started=bool(status.get("started")), fully_accelerated=status.get("fully_accelerated"),
                 adapter=adapter.group(1).strip() if adapter else None, vulkan_icd=icd)
    run.fallback_ops, run.split = _gpu_fallback(log)
    if code is None:
        run.reason = f"the GPU accelerator gave no result within {timeout:.0f} s"
    elif status.get("error") or code != 0 or not (d / "out.npz").exists():
        cause = _gpu_log_reason(log) or status.get("error") or child_reason(log, code)
        run.reason = (f"the GPU accelerator failed during a run: {cause}" if run.started
                      else f"the GPU accelerator did not start: {cause}")
    else:
        data = np.load(d / "out.npz")
        run.outputs = [[from_artifact(data[f"out_{j}_{s}"], t) for j, t in enumerate(info.outputs)]
                       for s in range(len(samples))]
    return run


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)(: .*)?$")


def child_reason(output: str, code: int | None) -> str:
    """One line saying why a child process failed, from its output: the last line of a Python
    traceback (`Type: message`), else the signal that killed it, else its exit status. The
    traceback itself never reaches the user's terminal or a `--json` output: the whole output is
    logged at debug level."""
    logger.debug("child process failed (exit status %s); its output:\n%s", code, output)
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    exc = [ln for ln in lines if _EXCEPTION_LINE.match(ln)]
    if exc:
        return exc[-1][:300]
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


def _text(b: bytes | str | None) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def _gpu_fallback(log: str) -> tuple[list[str] | None, str | None]:
    """The ops LiteRT's GPU delegate leaves to the CPU, as it logs them at compile time:
    "Following operations are not supported by GPU delegate:" then "OP: why" lines, then
    "N operations will run on the GPU, and the remaining M operations will run on the CPU."."""
    lines = [ln.strip() for ln in log.splitlines()]
    split = next((ln for ln in lines if re.search(r"operations will run on the GPU", ln)), None)
    if not any("not supported by GPU delegate" in ln for ln in lines):
        return None, split
    start = next(i for i, ln in enumerate(lines) if "not supported by GPU delegate" in ln) + 1
    ops = []
    for ln in lines[start:]:
        if not re.match(r"^[A-Z][A-Z0-9_]*: ", ln):
            break
        ops.append(ln)
    return ops, split


def _gpu_log_reason(log: str) -> str | None:
    """The line of LiteRT's log that says why the accelerator failed (Dawn's own words), if any."""
    lines = [ln.strip() for ln in log.splitlines()]
    keys = ("Failed to initialize WebGPU", "No adapters", "vkCreateInstance", "Didn't find op", "Failed to build",
            "required")
    hits = [ln for ln in lines if any(k in ln for k in keys) and not ln.startswith(("File ", "Traceback"))]
    return "; ".join(dict.fromkeys(re.sub(r"^(ERROR|Warning|E\d+ [\d:.]+ +\d+ \S+\]):? *", "", h)
                                   for h in hits[-3:]))[:400] or None
