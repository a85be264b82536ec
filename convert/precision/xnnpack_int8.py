"""Int8 for XNNPACK (static_int8_float_io, dynamic_int8): the int8 graph, or the int8 graph with
the ops XNNPACK has no kernel for in that int8 form kept in float32, whichever measures faster.

Dynamic int8: XNNPACK runs the quantizer's hybrid FULLY_CONNECTED and CONV_2D (int8 weights,
activations quantized on the fly) but not its hybrid DEPTHWISE_CONV_2D: on MobileNetV2 (128 px)
the 17 depthwise convs went to TFLite's builtin kernel and split the graph into 18 partitions.

XNNPACK (ai-edge-litert 2.3, on an x86 with AMX) takes the quantizer's int8 CONV_2D,
FULLY_CONNECTED, ADD, MEAN, QUANTIZE/DEQUANTIZE ..., but not int8 BATCH_MATMUL, SOFTMAX, GELU,
RSQRT or LayerNorm's SQUARED_DIFFERENCE/SUB (which int8 ops it takes varies by CPU: CI's x86 took
BATCH_MATMUL): measured on a 4-layer transformer encoder (d 128, 64 tokens, one thread), all-int8
split into 41 partitions and ran 2.2x slower than float32 (2.23 vs 1.10 ms); with those ops kept
float32 inside the int8 graph XNNPACK ran it whole (1 partition) in 0.37 ms.
On a conv net every op has an int8 kernel and nothing changes. Keeping ops in float is not
assumed to help: both forms are timed, interleaved, and the faster one is the variant.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from tpu_pipeline.convert.runtimes.delegation import xnnpack_plan
from tpu_pipeline.convert.runtimes.litert import LitertRunner
from tpu_pipeline.convert.tflite_info import inspect_model

ROUNDS = 3          # interleaved timing rounds per form
ROUND_BUDGET_S = 0.1  # seconds per form and round


def whole_on_xnnpack(float_model: bytes, int8_model: bytes, keeping_float: Callable[[list[str]], bytes],
                     row: dict[str, np.ndarray]) -> tuple[bytes, dict]:
    """-> (the variant, a record of the choice). `keeping_float(scopes)` makes the int8 variant with
    those op scopes left float32; `row` (input key -> array) is what both forms are timed on."""
    base = xnnpack_plan(float_model)
    plan = xnnpack_plan(int8_model)
    outside = [s for s in plan["left_scopes"] if s not in set(base["left_scopes"])]
    record = {"int8": _brief(plan)}
    if not outside:
        return int8_model, {**record, "chosen": "int8", "why": "XNNPACK runs every int8 op the float32 export gives it"}
    mixed = keeping_float(outside)
    record["int8_with_float_ops"] = _brief(xnnpack_plan(mixed))
    times = _interleaved({"int8": int8_model, "int8_with_float_ops": mixed}, row)
    record.update({f"{k}_ms": v for k, v in times.items()})
    chosen = min(times, key=times.get)
    record["chosen"] = chosen
    ops = ", ".join(f"{op} x{n}" for op, n in plan["left"].items())
    record["why"] = (f"XNNPACK has no int8 kernel for {ops}: all-int8 runs in {plan['partitions']} partition(s) "
                     f"({times['int8']:.3g} ms); with those ops float32 inside the int8 graph, "
                     f"{record['int8_with_float_ops']['partitions']} ({times['int8_with_float_ops']:.3g} ms): "
                     + ("kept in float32" if chosen != "int8" else "all-int8 is faster, kept int8"))
    return (mixed if chosen != "int8" else int8_model), record


def _brief(plan: dict) -> dict:
    return {k: v for k, v in plan.items() if k != "left_scopes"}


def _interleaved(models: dict[str, bytes], row: dict[str, np.ndarray]) -> dict[str, float]:
    """Median ms per form, one thread; forms alternate over ROUNDS so a busy moment hits both;
    the lowest round median per form (the least disturbed) is its figure."""
    runners = {}
    for name, m in models.items():
        info = inspect_model(m)
        runners[name] = (LitertRunner(m, info, threads=1), [row[t.key] for t in info.inputs])
    best: dict[str, float] = {}
    for _ in range(ROUNDS):
        for name, (runner, sample) in runners.items():
            ms = runner.latency_ms(sample, budget_s=ROUND_BUDGET_S)
            best[name] = min(best.get(name, ms), ms)
    return best
