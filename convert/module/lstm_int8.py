"""Full-integer (static int8) variant of a model with fused LSTMs, by TFLite's own calibrator.

ai-edge-quantizer 0.10 has no rule for UNIDIRECTIONAL_SEQUENCE_LSTM: its static int8 leaves the
op float32, which the iot target refuses. TFLite's post-training calibrator and quantizer (the
ones TFLiteConverter uses with a representative dataset; ai-edge-litert 2.3 ships them as
`_pywrap_tensorflow_lite_calibration_wrapper`) quantize the op the way TFLM's integer LSTM kernel
runs it: int8 input, weights and hidden state, int16 cell state (power-of-two scale), int32
biases, the gate scales carried by five intermediate tensors (`AddIntermediateTensors`), and
every other op int8 with int8 model inputs and outputs. The float export's state resets are taken
out before calibration and put back in integer after (lstm_reset.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.tools import flatbuffer_utils

from tpu_pipeline.convert.module.lstm_reset import reset_states, strip_resets
from tpu_pipeline.convert.precision.tflite_rewrites import inline_buffers, lookups_as_gather
from tpu_pipeline.convert.precision.tflm_int8 import for_tflm
from tpu_pipeline.errors import ConversionError

NOTE = ("static_int8: the fused LSTMs full-integer (int8 weights and hidden state, int16 cell state) by "
        "TFLite's own calibrator and quantizer, the ones TFLiteConverter uses (module/lstm_int8.py): "
        "ai-edge-quantizer 0.10 leaves UNIDIRECTIONAL_SEQUENCE_LSTM float32; each LSTM's state reset runs "
        "two integer steps")


def full_integer(float_model: bytes, calibration: list[dict[str, np.ndarray]]) -> bytes:
    """The float .tflite (fused LSTMs, their resets) -> int8 in, int8 out, every op integer.
    `calibration`: rows of {input key: array}, in the model's input order. The calibrator runs in
    a child process (_lstm_calibrator.py says why); its failure is a ConversionError."""
    if not calibration:
        raise ConversionError("static int8 of a fused LSTM needs calibration rows; none were given")
    worker = Path(__file__).parent / "_lstm_calibrator.py"  # by file: the child needs none of tpu_pipeline
    with tempfile.TemporaryDirectory(prefix="tpu-pipeline-lstm-int8-") as d:
        d = Path(d)
        # the quantizer has no EMBEDDING_LOOKUP; the same lookup as GATHER gets int8 (as quantize.py does)
        (d / "float.tflite").write_bytes(lookups_as_gather(strip_resets(float_model)))
        np.savez(d / "calib.npz", **{f"in_{i}_{r}": np.asarray(x) for r, row in enumerate(calibration)
                                      for i, x in enumerate(row.values())})
        proc = subprocess.run([sys.executable, str(worker), str(d / "float.tflite"), str(d / "calib.npz"),
                               str(d / "int8.tflite")], capture_output=True, text=True, timeout=600,
                              env=dict(os.environ, PYTHONPATH=""))
        if proc.returncode != 0 or not (d / "int8.tflite").exists():
            lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()
                     and not ln.strip().startswith(("File ", "Traceback", "^"))]
            why = lines[-1][:300] if lines else f"exit status {proc.returncode}"
            raise ConversionError(f"TFLite's calibrator could not make the full-integer LSTM variant: {why}")
        model = (d / "int8.tflite").read_bytes()
    return for_tflm(reset_states(_int16_intermediates(inline_buffers(model))))


def _int16_intermediates(model: bytes) -> bytes:
    """The LSTMs' four float32, zero-element gate intermediates (the layer-norm LSTM's scales; a
    plain LSTM's integer kernel reads only the fifth, the hidden scale) typed int16: TFLM fails to
    allocate an LSTM without all five, and a float32 tensor reads as a float kernel on a
    full-integer target."""
    obj = flatbuffer_utils.read_model_from_bytearray(bytearray(model))
    for g in obj.subgraphs:
        for op in g.operators:
            for i in (op.intermediates if op.intermediates is not None else []):
                t = g.tensors[i]
                if t.type == schema.TensorType.FLOAT32 and not t.buffer and 0 in list(t.shape):
                    t.type = schema.TensorType.INT16
    return bytes(flatbuffer_utils.convert_object_to_bytearray(obj))
