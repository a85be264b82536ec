"""Runs an artifact on a target's runtime: ai-edge-litert (XNNPACK, or the
reference kernels) or the real TFLM interpreter. Inputs are given and outputs
returned as float/int numpy arrays in PyTorch's terms: quantized I/O is
(de)quantized here with the tensor's scale and zero point, int64 inputs are
fed as the int32 the artifact declares."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from ai_edge_litert.interpreter import Interpreter, OpResolverType

from tpu_pipeline.convert.tflite_info import IOTensor, ModelInfo
from tpu_pipeline.errors import ConversionError

Sample = list[np.ndarray]  # one array per model input, in forward() order


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
    worker = Path(__file__).parent / "iot" / "_micro_worker.py"  # by file: the child needs none of tpu_pipeline
    with tempfile.TemporaryDirectory(prefix="tpu-pipeline-tflm-") as d:
        d = Path(d)
        (d / "model.tflite").write_bytes(model)
        feed = {}
        for s, sample in enumerate(samples):
            for x, t in zip(sample, info.inputs):
                feed[f"in_{t.position}_{s}"] = to_artifact(x, t)
        np.savez(d / "in.npz", **feed)
        env = dict(os.environ, PYTHONPATH="")
        proc = subprocess.run([sys.executable, str(worker), str(d / "model.tflite"), str(d / "in.npz"),
                               str(d / "out.npz"), str(arena_bytes), str(len(info.outputs))],
                              capture_output=True, text=True, timeout=600, env=env)
        if proc.returncode != 0 or not (d / "out.npz").exists():
            lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
            # TFLM prints its own reason (arena, missing op) before dying; Python's traceback is noise.
            tflm = [ln for ln in lines if re.search(r"fail|error|missing|didn't|unsupported|not found", ln, re.I)
                    and not ln.startswith(("File ", "Traceback"))]
            msg = "; ".join(tflm[-2:])[:400] if tflm else f"exit status {proc.returncode}"
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
