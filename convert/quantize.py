"""Float .tflite -> the variant a target asks for, with ai-edge-quantizer.

float32 is the artifact itself; float16 casts weights; dynamic_int8 stores
int8 weights and computes in float; static_int8 quantizes weights and
activations from calibration inputs and gives int8 model inputs/outputs
(token-id inputs stay int32), with embedding lookups as int8 GATHER
and every weight inside the flatbuffer (both in tflite_rewrites.py).
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np
from ai_edge_quantizer import quantizer, recipe

from tpu_pipeline.convert.tflite_rewrites import inline_buffers, lookups_as_gather
from tpu_pipeline.convert.tool_output import first_line, quiet_native
from tpu_pipeline.errors import ConversionError

RECIPES = {"dynamic_int8": "dynamic_wi8_afp32", "static_int8": "static_wi8_ai8"}
_FP16 = [{"regex": ".*", "operation": "*", "algorithm_key": "float_casting",
          "op_config": {"weight_tensor_config": {"num_bits": 16, "dtype": "FLOAT"},
                        "compute_precision": "FLOAT", "explicit_dequantize": True}}]


def recipe_for(precision: str):
    if precision == "float16":
        return _FP16
    return getattr(recipe, RECIPES[precision])()


def quantize(float_model: bytes, precision: str, calibration: list[dict[str, np.ndarray]] | None = None,
             signature: str = "serving_default", keep_float: Sequence[str] = ()) -> bytes:
    """keep_float: op scopes (an op's output tensor names, as ai-edge-quantizer matches them)
    left in float32: a per-op no_quantize entry after the precision's recipe (the last match wins)."""
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
                result = q.calibrate({signature: calibration or []}, num_threads=2)
            model = bytes(q.quantize(result, enable_progress_report=False).quantized_model)
    except Exception as e:  # noqa: BLE001
        raise ConversionError(f"ai-edge-quantizer could not make the {precision} variant: {type(e).__name__}: {first_line(e)}") from None
    # full-integer is the TFLM variant, and TFLM reads no external buffers (written from 256 KiB of weights)
    return inline_buffers(model) if precision == "static_int8" else model
