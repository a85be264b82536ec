"""The dynamic int8 variant's fused LSTMs with int8 weights: TFLite's hybrid LSTM kernel.

ai-edge-quantizer 0.10 has no rule for UNIDIRECTIONAL_SEQUENCE_LSTM: every recipe (float16,
dynamic int8, static int8) leaves its weights float32. TFLite's LSTM kernel runs a hybrid path
when the weights are int8 and the activations float32 (what TensorFlow's own dynamic-range
quantization makes of an LSTM): `int8_weights` quantizes the eight gate weight tensors of each
LSTM op, symmetric per tensor (the hybrid kernel reads one scale per weight tensor), biases and
state left float32. Measured on the speaker-encoder shape (3 x 256 units, T=160, one thread,
docs/BENCHMARKS.md): 3.1x smaller, about 2.5x faster than the float32 fused op (its x86 float
path is the portable matrix-vector loop; the hybrid one is SSE int8), cosine 0.999999 to PyTorch.
"""

from __future__ import annotations

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.tools import flatbuffer_utils

from tpu_pipeline.convert.module.lstm_reset import LSTM, lstm_count

WEIGHTS = range(1, 9)  # TFLite's input positions of the 4 input and 4 recurrent gate weights


def int8_weights(model: bytes) -> bytes:
    """The .tflite with every float32 gate weight of its UNIDIRECTIONAL_SEQUENCE_LSTM ops in int8
    (scale max|w| / 127, zero point 0); the bytes unchanged when there is none."""
    if not lstm_count(model):
        return model
    obj = flatbuffer_utils.read_model_from_bytearray(bytearray(model))
    codes = [flatbuffer_utils.get_builtin_code_from_operator_code(c) for c in obj.operatorCodes]
    for g in obj.subgraphs:
        done: set[int] = set()
        for op in g.operators:
            if codes[op.opcodeIndex] != LSTM:
                continue
            for i in (op.inputs[k] for k in WEIGHTS):
                t = g.tensors[i]
                if i in done or t.type != schema.TensorType.FLOAT32 or not t.buffer:
                    continue
                buf = obj.buffers[t.buffer]
                w = np.frombuffer(bytes(buf.data), np.float32)
                scale = float(np.abs(w).max()) / 127 or 1.0  # an all-zero tensor (the state reset's) stays zero
                buf.data = np.clip(np.round(w / scale), -127, 127).astype(np.int8).view(np.uint8)
                buf.offset = buf.size = 0  # the data now lives in the flatbuffer
                q = schema.QuantizationParametersT()
                q.scale, q.zeroPoint = [scale], [0]
                t.type, t.quantization = schema.TensorType.INT8, q
                done.add(i)
    return bytes(flatbuffer_utils.convert_object_to_bytearray(obj))
