"""Float .tflite -> the variant a target asks for, with ai-edge-quantizer.

float32 is the artifact itself; float16 casts weights; dynamic_int8 stores
int8 weights and computes in float; static_int8 quantizes weights and
activations from calibration inputs and gives int8 model inputs/outputs
(token-id inputs stay int32), with embedding lookups as int8 GATHER
and every weight inside the flatbuffer (both in tflite_rewrites.py) and the
microcontroller rewrites (tflm_int8.py): the iot target's full-integer form.
static_int8_float_io is the same int8 graph for XNNPACK (phones, web): float
model inputs/outputs (a QUANTIZE after each input, a DEQUANTIZE before each
output, which XNNPACK runs inside its partition) and none of the TFLM
rewrites: a GELU or SQRT as a CAST+GATHER table is an op XNNPACK does not
take, and splits its graph.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np
from ai_edge_quantizer import quantizer, recipe

from tpu_pipeline.convert.precision.tflite_rewrites import inline_buffers, lookups_as_gather
from tpu_pipeline.convert.precision.tflm_int8 import for_tflm
from tpu_pipeline.convert.tflite_info import inspect_model
from tpu_pipeline.convert.tool_output import first_line, quiet_native
from tpu_pipeline.convert.verdict.int8_ranges import observed_ranges
from tpu_pipeline.errors import ConversionError

RECIPES = {"dynamic_int8": "dynamic_wi8_afp32", "static_int8": "static_wi8_ai8", "static_int8_float_io": "static_wi8_ai8"}
CALIBRATED = ("static_int8", "static_int8_float_io")  # the precisions that need calibration rows
# ai-edge-quantizer's virtual INPUT/OUTPUT ops left unquantized: float model I/O around the int8 graph
_FLOAT_IO = [{"regex": ".*", "operation": op, "algorithm_key": "no_quantize", "op_config": {}}
             for op in ("INPUT", "OUTPUT")]
_FP16 = [{"regex": ".*", "operation": "*", "algorithm_key": "float_casting",
          "op_config": {"weight_tensor_config": {"num_bits": 16, "dtype": "FLOAT"},
                        "compute_precision": "FLOAT", "explicit_dequantize": True}}]


def recipe_for(precision: str):
    if precision == "float16":
        return _FP16
    return getattr(recipe, RECIPES[precision])() + (_FLOAT_IO if precision == "static_int8_float_io" else [])


# How static int8 sets each activation's range from the calibration rows (int8_ranges.py finds
# what the first one clips; the accuracy-aware rounds try the other):
DEFAULT_RANGES = "moving_average"  # RANGE_ESTIMATORS key: ai-edge-quantizer's own
RANGE_ESTIMATORS = {
    "moving_average": "ai-edge-quantizer's default: a moving average (smoothing 0.95) of each row's min/max",
    "min_max": "the exact min/max over all calibration rows (no calibration value is clipped)",
}


def quantize(float_model: bytes, precision: str,
             calibration: list[dict[str, np.ndarray]] | dict[str, list[dict[str, np.ndarray]]] | None = None,
             signature: str = "serving_default", keep_float: Sequence[str] = (),
             range_estimator: str = DEFAULT_RANGES) -> bytes:
    """keep_float: op scopes (an op's output tensor names, as ai-edge-quantizer matches them)
    left in float32: a per-op no_quantize entry after the precision's recipe (the last match wins).
    range_estimator: RANGE_ESTIMATORS key (static int8)."""
    if range_estimator not in RANGE_ESTIMATORS:
        raise ValueError(f"range_estimator {range_estimator!r}; valid: {', '.join(RANGE_ESTIMATORS)}")
    if precision == "float32":
        return float_model
    if precision == "static_int8":
        # the recipe leaves EMBEDDING_LOOKUP's table float32; the same lookup as GATHER gets int8
        float_model = lookups_as_gather(float_model)
    # the quantizer's scope is the output names joined by ';' with a trailing ';'
    rec = list(recipe_for(precision)) + [{"regex": "^" + re.escape(scope) + ";$", "operation": "*",
                                          "algorithm_key": "no_quantize", "op_config": {}} for scope in keep_float]
    try:
        with quiet_native():
            q = quantizer.Quantizer(bytearray(float_model), rec)
            result = None
            if q.need_calibration:
                # a dict: rows per signature (shape buckets, convert/shapes.py), each keyed by its input names
                rows = calibration if isinstance(calibration, dict) else {signature: calibration or []}
                result = q.calibrate(rows, num_threads=2)
                if range_estimator == "min_max":
                    result = _widen_to_min_max(result, float_model, calibration or [])
            model = bytes(q.quantize(result, enable_progress_report=False).quantized_model)
    except Exception as e:  # noqa: BLE001
        raise ConversionError(f"ai-edge-quantizer could not make the {precision} variant: {type(e).__name__}: {first_line(e)}") from None
    if precision != "static_int8":
        return model  # static_int8_float_io: XNNPACK reads external buffers and runs GELU/SQRT/ABS in int8
    # full-integer is the TFLM variant, and TFLM reads no external buffers (written from 256 KiB of
    # weights) nor runs int8 REDUCE_MAX/GELU/SQRT/ABS as the quantizer writes them (tflm_int8.py)
    return for_tflm(inline_buffers(model))


def _widen_to_min_max(qsvs: dict, float_model: bytes, calibration: list[dict[str, np.ndarray]]) -> dict:
    """The quantizer's calibration result (tensor name -> {"min", "max"} arrays) widened to the exact
    min/max each activation reaches over the calibration rows. ai-edge-quantizer's calibrator takes
    an update function, but Quantizer.calibrate does not pass one on; its result is the public
    hand-over between calibrate and quantize, so the ranges are set there."""
    inputs = inspect_model(float_model).inputs
    exact = observed_ranges(float_model, ([row[t.key] for t in inputs] for row in calibration))
    out = {}
    for name, qsv in qsvs.items():
        if name in exact and qsv and "min" in qsv and "max" in qsv:
            lo, hi = exact[name]
            qsv = {**qsv, "min": np.minimum(qsv["min"], lo), "max": np.maximum(qsv["max"], hi)}
        out[name] = qsv
    return out
