"""Every invoke of a fused LSTM starts from a zero state, as PyTorch's nn.LSTM does.

TFLite's UNIDIRECTIONAL_SEQUENCE_LSTM keeps its hidden and cell state in variable tensors: zero
when the interpreter allocates them, and left holding the last step's state after an invoke, so
the next invoke continues the previous sequence. Measured on ai-edge-litert 2.3 (XNNPACK and the
reference kernels) and on TFLM: the first run matched PyTorch (3e-8), the second and third were
off by 0.03-0.04 (both runtimes reset only when asked: `reset_all_variables()`,
`ResetVariableTensors()`). An app that does not know this gets wrong outputs from the second
sequence on.

`reset_states` puts, right after each LSTM op, a one-step LSTM over the same two state tensors
whose gates are shut: zero weights on a zero input, input/forget/output gate biases of
-RESET_BIAS (sigmoid -> 0), so it writes c = 0 * c + 0 * g = 0 and h = 0 * tanh(0) = 0. Its
output is read by nothing. It costs one recurrent-weight-sized zero tensor per hidden size
(shared by every LSTM of that size) and one time step of compute.

A full-integer LSTM (lstm_int8.py: int8 hidden state, int16 cell state) gets the same reset in
integer: its gates saturate at sigmoid(-8) = 11/32768 instead of 0, so it runs two steps (c is
scaled by (11/32768)^2 and rounds to 0, h = o * tanh(c) to its zero point) on an input of the
LSTM's own zero point, with its own input weights (a zero-point input contributes nothing, the
bias alone reaches the gates), a zero recurrent weight and int32 shut-gate biases in each gate's
bias scale. `strip_resets` takes the float resets out again, tensors and constants too, before
TFLite's calibrator quantizes the LSTMs (lstm_int8.py), and the integer ones go in after.
"""

from __future__ import annotations

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.tools import flatbuffer_utils

RESET_BIAS = 1e4  # sigmoid(-1e4) is 0 in float32; gate inputs on a zero input with zero weights are the bias alone
LSTM = schema.BuiltinOperator.UNIDIRECTIONAL_SEQUENCE_LSTM
STATE_H, STATE_C = 18, 19  # TFLite's input positions of the output (hidden) state and the cell state


def lstm_count(model: bytes) -> int:
    obj = schema.Model.GetRootAs(model, 0)
    codes = [max(obj.OperatorCodes(i).BuiltinCode(), obj.OperatorCodes(i).DeprecatedBuiltinCode())
             for i in range(obj.OperatorCodesLength())]
    return sum(codes[g.Operators(k).OpcodeIndex()] == LSTM for j in range(obj.SubgraphsLength())
               for g in [obj.Subgraphs(j)] for k in range(g.OperatorsLength()))


def reset_states(model: bytes) -> bytes:
    """The .tflite with a state-zeroing step after each float32 UNIDIRECTIONAL_SEQUENCE_LSTM; the bytes
    unchanged when there is none. Idempotent: an LSTM already followed by its reset is left alone."""
    if not lstm_count(model):
        return model
    obj = flatbuffer_utils.read_model_from_bytearray(bytearray(model))
    codes = [flatbuffer_utils.get_builtin_code_from_operator_code(c) for c in obj.operatorCodes]
    lstm = codes.index(LSTM)
    for g in obj.subgraphs:
        consts: dict[tuple, int] = {}

        def const(value: float, shape: tuple[int, ...]) -> int:  # one shared constant per value and shape
            key = (value, shape)
            if key not in consts:
                buf = schema.BufferT()
                buf.data = np.full(shape, value, np.float32).view(np.uint8).reshape(-1)
                obj.buffers.append(buf)
                consts[key] = _tensor(g, shape, len(obj.buffers) - 1, f"lstm_reset/{value:g}/{'x'.join(map(str, shape))}")
            return consts[key]

        ops, out = list(g.operators), []
        for i, op in enumerate(ops):
            out.append(op)
            if op.opcodeIndex != lstm or _is_reset(op, ops[i - 1] if i else None, lstm) \
                    or _is_reset(ops[i + 1] if i + 1 < len(ops) else None, op, lstm):
                continue
            h_state, c_state = op.inputs[STATE_H], op.inputs[STATE_C]
            if g.tensors[h_state].type == schema.TensorType.INT8 and g.tensors[c_state].type == schema.TensorType.INT16:
                out.append(_int8_reset(obj, g, op, i))
                continue
            if g.tensors[h_state].type != schema.TensorType.FLOAT32:
                continue  # a hybrid or other quantized state: neither reset holds
            batch, hidden = (int(d) for d in g.tensors[h_state].shape)
            shut, zero = const(-RESET_BIAS, (hidden,)), const(0.0, (hidden,))
            w, r = const(0.0, (hidden, 1)), const(0.0, (hidden, hidden))
            x = const(0.0, (batch, 1, 1))
            y = _tensor(g, (batch, 1, hidden), 0, f"lstm_reset/out{i}")
            reset = schema.OperatorT()
            reset.opcodeIndex = lstm
            reset.inputs = [x, w, w, w, w, r, r, r, r, -1, -1, -1, shut, shut, zero, shut, -1, -1,
                            h_state, c_state, -1, -1, -1, -1]
            reset.outputs = [y]
            reset.builtinOptionsType = schema.BuiltinOptions.UnidirectionalSequenceLSTMOptions
            reset.builtinOptions = schema.UnidirectionalSequenceLSTMOptionsT()
            reset.builtinOptions.fusedActivationFunction = schema.ActivationFunctionType.TANH
            reset.builtinOptions.timeMajor = False
            out.append(reset)
        g.operators = out
    return bytes(flatbuffer_utils.convert_object_to_bytearray(obj))


def _tensor(g, shape: tuple[int, ...], buffer: int, name: str, dtype: int = schema.TensorType.FLOAT32,
            scale: float | None = None, zero_point: int = 0) -> int:
    t = schema.TensorT()
    t.shape, t.type, t.buffer, t.name = np.array(shape, np.int32), dtype, buffer, name
    if scale is not None:
        t.quantization = schema.QuantizationParametersT()
        t.quantization.scale, t.quantization.zeroPoint = [float(scale)], [int(zero_point)]
    g.tensors.append(t)
    return len(g.tensors) - 1


def _quant(t) -> tuple[float, int]:
    return float(t.quantization.scale[0]), int(t.quantization.zeroPoint[0])


INT8_RESET_STEPS = 2  # each step scales the cell state by at most 11/32768: two round it to 0


def _int8_reset(obj, g, op, i: int):
    """The integer reset of the full-integer LSTM `op` (the module docstring): a new operator."""
    def const(data: np.ndarray, dtype: int, name: str, scale: float, zero_point: int = 0) -> int:
        buf = schema.BufferT()
        buf.data = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        obj.buffers.append(buf)
        return _tensor(g, data.shape, len(obj.buffers) - 1, f"lstm_reset/{name}{i}", dtype, scale, zero_point)

    h_state, c_state = op.inputs[STATE_H], op.inputs[STATE_C]
    batch, hidden = (int(d) for d in g.tensors[h_state].shape)
    x_scale, x_zp = _quant(g.tensors[op.inputs[0]])
    features = int(g.tensors[op.inputs[0]].shape[-1])
    x = const(np.full((batch, INT8_RESET_STEPS, features), x_zp, np.int8), schema.TensorType.INT8, "x", x_scale, x_zp)
    r = const(np.zeros((hidden, hidden), np.int8), schema.TensorType.INT8, "r",
              _quant(g.tensors[op.inputs[5]])[0])
    biases = []
    for gate, w in zip("ifco", op.inputs[1:5]):  # the bias scale is input scale x that gate's weight scale
        scale = x_scale * _quant(g.tensors[w])[0]
        value = 0 if gate == "c" else max(-(1 << 30), round(-RESET_BIAS / scale))
        biases.append(const(np.full(hidden, value, np.int32), schema.TensorType.INT32, f"b_{gate}", scale))
    h_scale, h_zp = _quant(g.tensors[h_state])
    y = _tensor(g, (batch, INT8_RESET_STEPS, hidden), 0, f"lstm_reset/out{i}", schema.TensorType.INT8, h_scale, h_zp)
    reset = schema.OperatorT()
    reset.opcodeIndex = op.opcodeIndex
    reset.inputs = [x, *op.inputs[1:5], r, r, r, r, -1, -1, -1, *biases, -1, -1, h_state, c_state, -1, -1, -1, -1]
    reset.outputs = [y]
    reset.intermediates = list(op.intermediates)  # the gate and hidden scales the integer kernel reads
    reset.builtinOptionsType = schema.BuiltinOptions.UnidirectionalSequenceLSTMOptions
    reset.builtinOptions = schema.UnidirectionalSequenceLSTMOptionsT()
    reset.builtinOptions.fusedActivationFunction = schema.ActivationFunctionType.TANH
    reset.builtinOptions.timeMajor = False
    return reset


def strip_resets(model: bytes) -> bytes:
    """The .tflite without the reset steps `reset_states` added, nor their tensors (renumbered) and
    constants (buffers emptied): TFLite's quantizer leaves an unread constant float32, which the
    full-integer target refuses."""
    if not lstm_count(model):
        return model
    obj = flatbuffer_utils.read_model_from_bytearray(bytearray(model))
    lstm = [flatbuffer_utils.get_builtin_code_from_operator_code(c) for c in obj.operatorCodes].index(LSTM)
    for g in obj.subgraphs:
        ops = list(g.operators)
        g.operators = [op for k, op in enumerate(ops) if not (k and _is_reset(op, ops[k - 1], lstm))]
        lists = [g.inputs, g.outputs] + [x for op in g.operators for x in (op.inputs, op.outputs, op.intermediates)
                                         if x is not None]
        kept = sorted({int(i) for x in lists for i in x if i >= 0})
        new = {old: k for k, old in enumerate(kept)}
        for k, t in enumerate(g.tensors):
            if k not in new and t.buffer:
                obj.buffers[t.buffer].data = None
        g.tensors = [g.tensors[i] for i in kept]
        g.inputs, g.outputs = [new[i] for i in g.inputs], [new[i] for i in g.outputs]
        for op in g.operators:
            for name in ("inputs", "outputs", "intermediates"):
                if getattr(op, name) is not None:
                    setattr(op, name, [new[i] if i >= 0 else -1 for i in getattr(op, name)])
    return bytes(flatbuffer_utils.convert_object_to_bytearray(obj))


def _is_reset(op, before, lstm: int) -> bool:
    """`op` is the reset of the LSTM `before` it (same state tensors)."""
    return (op is not None and before is not None and op.opcodeIndex == lstm and before.opcodeIndex == lstm
            and list(before.inputs[STATE_H:STATE_C + 1]) == list(op.inputs[STATE_H:STATE_C + 1]))
