"""Static int8 rewrites for ops that TFLM cannot run in int8, applied by
quantize.py to every static int8 (full-integer, the iot target's) variant.

Found by running each op through ai-edge-quantizer 0.10 (`static_wi8_ai8`)
and the tflite-micro interpreter (issue 21):
- REDUCE_MAX (`x.amax(dim)`, `torch.max(x, dim).values`, max over time): the
  quantizer has no REDUCE_MAX in its op tables (algorithm_manager.py lists
  REDUCE_MIN only), so it leaves the op float32 between a DEQUANTIZE and a
  QUANTIZE; TFLM has an int8 REDUCE_MAX whose output keeps the input's scale
  (a max of int8 codes is the code of the max). `reduce_max_in_int8` feeds
  it the int8 tensor and keeps the QUANTIZE as an int8 requantisation.
- GELU: the quantizer makes an int8 GELU, but TFLM registers no GELU kernel
  ("Failed to get registration from op code GELU").
- SQRT: the quantizer makes an int8 SQRT; TFLM's SQRT kernel is float32 only
  (the interpreter fails at invoke).
- ABS: left float32 between DEQUANTIZE and QUANTIZE by the quantizer.
  `elementwise_as_table` computes each of these unary ops as TFLite's own int8
  kernels compute GELU: a 256-entry table over the input's int8 codes, here
  CAST (int8 -> int32 codes) -> ADD 128 -> GATHER(table). The table holds
  f(dequantized code), requantized with the output's calibrated scale, so the
  result is the int8 rounding of the exact function (GELU's erf or tanh form,
  as the op's option says), never an approximation of it.
RSQRT, LayerNorm's pattern (MEAN, SQUARED_DIFFERENCE, RSQRT, MUL, ADD) and
the rest run int8 on TFLM as the quantizer writes them.
"""

from __future__ import annotations

import json
import math

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.tools import flatbuffer_utils

_B = schema.BuiltinOperator
_INT8, _INT32, _FLOAT32 = schema.TensorType.INT8, schema.TensorType.INT32, schema.TensorType.FLOAT32


def _gelu(x: np.ndarray, tanh: bool) -> np.ndarray:
    if tanh:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


# op -> f(float64 values, op) for the ops tabulated; int8 in TFLM lacks them
_TABLED = {
    _B.GELU: lambda x, op: _gelu(x, bool(op.builtinOptions and op.builtinOptions.approximate)),
    _B.SQRT: lambda x, op: np.sqrt(np.maximum(x, 0.0)),
    _B.ABS: lambda x, op: np.abs(x),
}
NAMES = {_B.GELU: "GELU", _B.SQRT: "SQRT", _B.ABS: "ABS", _B.REDUCE_MAX: "REDUCE_MAX"}


class _Graph:
    """One subgraph's producers/consumers and the model's op codes, for small edits."""

    def __init__(self, obj, subgraph):
        self.obj, self.sg = obj, subgraph
        self.codes = [flatbuffer_utils.get_builtin_code_from_operator_code(c) for c in obj.operatorCodes or []]

    def code(self, op) -> int:
        return self.codes[op.opcodeIndex]

    def producer(self, tensor: int):
        return next((op for op in self.sg.operators if tensor in list(op.outputs)), None)

    def consumers(self, tensor: int) -> list:
        return [op for op in self.sg.operators if tensor in list(op.inputs)]

    def is_output(self, tensor: int) -> bool:
        return tensor in list(self.sg.outputs)

    def opcode(self, builtin: int) -> int:
        if builtin in self.codes:
            return self.codes.index(builtin)
        c = schema.OperatorCodeT()
        c.builtinCode, c.deprecatedBuiltinCode, c.version = builtin, min(builtin, 127), 1
        self.obj.operatorCodes.append(c)
        self.codes.append(builtin)
        return len(self.codes) - 1

    def tensor(self, name: str, shape, dtype, data: np.ndarray | None = None, quant=None) -> int:
        buf = schema.BufferT()
        if data is not None:
            buf.data = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8)
        self.obj.buffers.append(buf)
        t = schema.TensorT()
        t.name, t.shape, t.type, t.buffer = name.encode(), np.array(shape, np.int32), dtype, len(self.obj.buffers) - 1
        t.quantization = quant
        self.sg.tensors.append(t)
        return len(self.sg.tensors) - 1

    def op(self, builtin: int, inputs, outputs, options_type=0, options=None):
        o = schema.OperatorT()
        o.opcodeIndex, o.inputs, o.outputs = self.opcode(builtin), list(inputs), list(outputs)
        o.builtinOptionsType, o.builtinOptions = options_type, options
        return o


def _qparams(t) -> tuple[float, int] | None:
    q = t.quantization
    if t.type != _INT8 or q is None or q.scale is None or len(q.scale) != 1:
        return None
    return float(q.scale[0]), int(q.zeroPoint[0])


def _dequantize_of(g: _Graph, tensor: int):
    """The DEQUANTIZE that makes float `tensor` from an int8 tensor, else None."""
    dq = g.producer(tensor)
    if dq is None or g.code(dq) != _B.DEQUANTIZE:
        return None
    return dq if _qparams(g.sg.tensors[dq.inputs[0]]) else None


def _drop_if_unread(g: _Graph, op) -> None:
    """Removes `op` (a bypassed DEQUANTIZE/QUANTIZE) once nothing reads its output."""
    if op in g.sg.operators and not g.consumers(op.outputs[0]) and not g.is_output(op.outputs[0]):
        g.sg.operators.remove(op)


def _only_quantize(g: _Graph, tensor: int):
    """The QUANTIZE to int8 that is the only reader of float `tensor`."""
    users = g.consumers(tensor)
    if len(users) != 1 or g.code(users[0]) != _B.QUANTIZE or g.is_output(tensor):
        return None
    return users[0] if _qparams(g.sg.tensors[users[0].outputs[0]]) else None


def _drop_unused_tensors(obj, sg) -> None:
    """Removes the tensors no op, input or output refers to (the float ones a rewrite bypassed:
    the iot checks read every tensor's dtype), renumbering the rest."""
    used = set(sg.inputs) | set(sg.outputs)
    for op in sg.operators:
        used |= {i for i in op.inputs if i >= 0} | set(op.outputs) | set(op.intermediates if op.intermediates is not None else [])
    keep = [i for i in range(len(sg.tensors)) if i in used]
    if len(keep) == len(sg.tensors):
        return
    new = {old: i for i, old in enumerate(keep)}
    sg.tensors = [sg.tensors[i] for i in keep]
    renum = lambda xs: [new[i] if i >= 0 else i for i in xs]  # noqa: E731 - -1 marks an omitted optional input
    sg.inputs, sg.outputs = renum(sg.inputs), renum(sg.outputs)
    for op in sg.operators:
        op.inputs, op.outputs = renum(op.inputs), renum(op.outputs)
        if op.intermediates is not None:
            op.intermediates = renum(op.intermediates)
    at = obj.subgraphs.index(sg)
    for sig in obj.signatureDefs or []:  # signatures name their tensors by index too
        for t in (sig.inputs or []) + (sig.outputs or []) if sig.subgraphIndex == at else []:
            t.tensorIndex = new[t.tensorIndex]


def reduce_max_in_int8(model: bytes) -> tuple[bytes, int]:
    """DEQUANTIZE -> REDUCE_MAX (float32) -> QUANTIZE as REDUCE_MAX (int8, the input's scale) -> QUANTIZE;
    -> (the model, how many were rewritten); the bytes unchanged when none."""
    obj = flatbuffer_utils.read_model_from_bytearray(bytearray(model))
    n = 0
    for sg in obj.subgraphs:
        g = _Graph(obj, sg)
        for op in list(sg.operators):
            if g.code(op) != _B.REDUCE_MAX or sg.tensors[op.outputs[0]].type != _FLOAT32:
                continue
            dq, q = _dequantize_of(g, op.inputs[0]), _only_quantize(g, op.outputs[0])
            if dq is None or q is None:
                continue
            src = sg.tensors[dq.inputs[0]]
            out = sg.tensors[op.outputs[0]]
            scale, zp = _qparams(src)
            out.type = _INT8
            out.quantization = schema.QuantizationParametersT()
            out.quantization.scale, out.quantization.zeroPoint = [scale], [zp]
            op.inputs = [dq.inputs[0], *list(op.inputs)[1:]]
            _drop_if_unread(g, dq)
            n += 1
        _drop_unused_tensors(obj, sg)
    return (bytes(flatbuffer_utils.convert_object_to_bytearray(obj)), n) if n else (model, 0)


def elementwise_as_table(model: bytes) -> tuple[bytes, dict[str, int]]:
    """Int8 GELU/SQRT, and ABS left float between DEQUANTIZE and QUANTIZE, as a 256-entry int8 table
    lookup (CAST, ADD, GATHER); -> (the model, {op name: count}); the bytes unchanged when none."""
    obj = flatbuffer_utils.read_model_from_bytearray(bytearray(model))
    done: dict[str, int] = {}
    for sg in obj.subgraphs:
        g = _Graph(obj, sg)
        for op in list(sg.operators):
            code = g.code(op)
            if code not in _TABLED:
                continue
            x, y = op.inputs[0], op.outputs[0]
            drop = []
            if sg.tensors[x].type == _FLOAT32:  # left float by the quantizer: take the int8 tensors around it
                dq, q = _dequantize_of(g, x), _only_quantize(g, y)
                if dq is None or q is None:
                    continue
                x, y, drop = dq.inputs[0], q.outputs[0], [q, dq]
            in_q, out_q = _qparams(sg.tensors[x]), _qparams(sg.tensors[y])
            if in_q is None or out_q is None:
                continue
            codes = np.arange(-128, 128, dtype=np.float64)
            values = _TABLED[code](in_q[0] * (codes - in_q[1]), op)
            table = np.clip(np.round(values / out_q[0]) + out_q[1], -128, 127).astype(np.int8)
            name = sg.tensors[y].name.decode()
            shape = list(sg.tensors[x].shape)
            t_table = g.tensor(f"{name}/table", [256], _INT8, table, sg.tensors[y].quantization)
            t_codes = g.tensor(f"{name}/codes", shape, _INT32)
            t_128 = g.tensor(f"{name}/offset", [], _INT32, np.array(128, np.int32))
            t_index = g.tensor(f"{name}/index", shape, _INT32)
            cast_opts = schema.CastOptionsT()
            cast_opts.inDataType, cast_opts.outDataType = _INT8, _INT32
            new = [g.op(_B.CAST, [x], [t_codes], schema.BuiltinOptions.CastOptions, cast_opts),
                   g.op(_B.ADD, [t_codes, t_128], [t_index], schema.BuiltinOptions.AddOptions, schema.AddOptionsT()),
                   g.op(_B.GATHER, [t_table, t_index], [y], schema.BuiltinOptions.GatherOptions,
                        schema.GatherOptionsT(axis=0, batchDims=0))]
            at = sg.operators.index(op)
            sg.operators[at:at + 1] = new
            if drop:
                sg.operators.remove(drop[0])  # the QUANTIZE: the table writes its output
                _drop_if_unread(g, drop[1])
            done[NAMES[code]] = done.get(NAMES[code], 0) + 1
        _drop_unused_tensors(obj, sg)
    return (bytes(flatbuffer_utils.convert_object_to_bytearray(obj)), done) if done else (model, {})


METADATA = "tpu_pipeline.tflm_int8"  # the model's metadata entry: JSON {op: count} of what was rewritten


def for_tflm(model: bytes) -> bytes:
    """Both rewrites, with what they changed recorded in the model's metadata (`notes` reads it)."""
    root = schema.Model.GetRootAs(model, 0)
    codes = {max(root.OperatorCodes(i).BuiltinCode(), root.OperatorCodes(i).DeprecatedBuiltinCode())
             for i in range(root.OperatorCodesLength())}
    if not codes & set(NAMES):  # most models: nothing to do, and no object-API parse of the whole file
        return model
    model, n_max = reduce_max_in_int8(model)
    model, tabled = elementwise_as_table(model)
    done = {**({"REDUCE_MAX": n_max} if n_max else {}), **tabled}
    if not done:
        return model
    obj = flatbuffer_utils.read_model_from_bytearray(bytearray(model))
    buf = schema.BufferT()
    buf.data = np.frombuffer(json.dumps(done, sort_keys=True).encode(), np.uint8)
    obj.buffers.append(buf)
    meta = schema.MetadataT()
    meta.name, meta.buffer = METADATA.encode(), len(obj.buffers) - 1
    obj.metadata = [*(obj.metadata or []), meta]
    return bytes(flatbuffer_utils.convert_object_to_bytearray(obj))


_NOTE = {
    "REDUCE_MAX": "REDUCE_MAX runs int8 in TFLM (the quantizer left it float32; a max keeps its input's scale)",
    "GELU": "GELU as an int8 table (CAST, ADD, GATHER): TFLM has no GELU kernel",
    "SQRT": "SQRT as an int8 table (CAST, ADD, GATHER): TFLM's SQRT is float32 only",
    "ABS": "ABS as an int8 table (CAST, ADD, GATHER): the quantizer left it float32",
}


def rewrites(model: bytes) -> dict[str, int]:
    """{op: count} that `for_tflm` rewrote in this model; {} for any other model."""
    root = schema.Model.GetRootAs(model, 0)
    for i in range(root.MetadataLength()):
        m = root.Metadata(i)
        if m.Name() == METADATA.encode():
            return json.loads(root.Buffers(m.Buffer()).DataAsNumpy().tobytes())
    return {}


def notes(model: bytes) -> list[str]:
    """One report note per rewritten op kind (the rewrite named, with its count and why)."""
    return [f"static int8 for TFLM: {n} {_NOTE[op]} (convert/tflm_int8.py)" for op, n in sorted(rewrites(model).items())]
