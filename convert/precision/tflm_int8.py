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

Activations (issue 30), measured the same way (Conv1d -> act -> Conv1d):
- LeakyReLU: left float32 between DEQUANTIZE and QUANTIZE; TFLM has an int8
  LEAKY_RELU (it requantizes between the input's and output's scales), so
  `leaky_relu_in_int8` feeds it the int8 tensors.
- ELU, SELU, Mish: lowered to EXP/LOG/TANH/GREATER/SELECT chains, part float32
  (EXP, LOG), and TFLM registers no SELECT at all. Even in int8 the chain would
  round each step (ELU's exp(x) - 1 on the scale of exp's whole range).
  `activations_as_table` finds each such chain (elementwise ops fed by one int8
  tensor and scalar constants, ending in one int8 tensor) and computes the whole
  chain as one 256-entry table, the int8 rounding of the exact function.
  clamp(x, lo, hi) with lo/hi not (0, 6) (MAXIMUM int8, then MINIMUM left
  float32) is tabulated the same way.
- PReLU (RELU, MUL, MUL, SUB), Hardswish (HARD_SWISH), Hardsigmoid and ReLU6
  (folded into the conv's fused activation), SiLU (LOGISTIC, MUL): int8 on TFLM
  as the quantizer writes them.
- CONCATENATION of more than 10 inputs (litert-torch's unrolled LSTM stacks
  all T steps in one): TFLM's kernel fails to prepare it at any arena;
  `concatenations_in_groups` concatenates in groups of 8, then the groups.
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


def _table_lookup(g, x: int, y: int, values: np.ndarray, out_q: tuple) -> list:
    """The three ops that compute y = table[x + 128] for int8 x: `values` is y's float value at each of
    x's 256 codes, rounded here into y's own quantization."""
    table = np.clip(np.round(values / out_q[0]) + out_q[1], -128, 127).astype(np.int8)
    sg = g.sg
    name, shape = sg.tensors[y].name.decode(), list(sg.tensors[x].shape)
    t_table = g.tensor(f"{name}/table", [256], _INT8, table, sg.tensors[y].quantization)
    t_codes = g.tensor(f"{name}/codes", shape, _INT32)
    t_128 = g.tensor(f"{name}/offset", [], _INT32, np.array(128, np.int32))
    t_index = g.tensor(f"{name}/index", shape, _INT32)
    cast_opts = schema.CastOptionsT()
    cast_opts.inDataType, cast_opts.outDataType = _INT8, _INT32
    return [g.op(_B.CAST, [x], [t_codes], schema.BuiltinOptions.CastOptions, cast_opts),
            g.op(_B.ADD, [t_codes, t_128], [t_index], schema.BuiltinOptions.AddOptions, schema.AddOptionsT()),
            g.op(_B.GATHER, [t_table, t_index], [y], schema.BuiltinOptions.GatherOptions,
                 schema.GatherOptionsT(axis=0, batchDims=0))]


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
            new = _table_lookup(g, x, y, _TABLED[code](in_q[0] * (codes - in_q[1]), op), out_q)
            at = sg.operators.index(op)
            sg.operators[at:at + 1] = new
            if drop:
                sg.operators.remove(drop[0])  # the QUANTIZE: the table writes its output
                _drop_if_unread(g, drop[1])
            done[NAMES[code]] = done.get(NAMES[code], 0) + 1
        _drop_unused_tensors(obj, sg)
    return (bytes(flatbuffer_utils.convert_object_to_bytearray(obj)), done) if done else (model, {})


def leaky_relu_in_int8(model: bytes) -> tuple[bytes, int]:
    """DEQUANTIZE -> LEAKY_RELU (float32) -> QUANTIZE(s) as one int8 LEAKY_RELU (TFLM requantizes from the
    input's scale to the output's); -> (the model, how many); the bytes unchanged when none."""
    obj = flatbuffer_utils.read_model_from_bytearray(bytearray(model))
    n = 0
    for sg in obj.subgraphs:
        g = _Graph(obj, sg)
        for op in list(sg.operators):
            if g.code(op) != _B.LEAKY_RELU or sg.tensors[op.inputs[0]].type != _FLOAT32:
                continue
            dq, users = _dequantize_of(g, op.inputs[0]), g.consumers(op.outputs[0])
            if dq is None or not users or g.is_output(op.outputs[0]) or any(
                    g.code(u) != _B.QUANTIZE or _qparams(sg.tensors[u.outputs[0]]) is None for u in users):
                continue
            # a U-Net's skip: the float output quantized twice (the next conv's scale, the concatenation's);
            # the op writes the first int8 tensor and the others requantize it (int8 -> int8 QUANTIZE)
            q, rest = users[0], users[1:]
            op.inputs, op.outputs = [dq.inputs[0]], [q.outputs[0]]
            sg.operators.remove(q)
            for u in rest:
                u.inputs = [q.outputs[0]]
            _drop_if_unread(g, dq)
            n += 1
        _drop_unused_tensors(obj, sg)
    return (bytes(flatbuffer_utils.convert_object_to_bytearray(obj)), n) if n else (model, 0)


MAX_CONCAT_INPUTS = 10  # TFLM's CONCATENATION kernel (kMaxInputNum): more fail to prepare at any arena
CONCAT_GROUP = 8


def concatenations_in_groups(model: bytes) -> tuple[bytes, int]:
    """Each CONCATENATION of more than MAX_CONCAT_INPUTS inputs (litert-torch's unrolled LSTM stacks its
    T steps in one) as concatenations of at most CONCAT_GROUP inputs, then of the groups; the groups
    take the output's quantization (int8 concatenation copies codes: inputs and output share it).
    -> (the model, how many); the bytes unchanged when none."""
    obj = flatbuffer_utils.read_model_from_bytearray(bytearray(model))
    n = 0
    for sg in obj.subgraphs:
        g = _Graph(obj, sg)
        for op in list(sg.operators):
            if g.code(op) != _B.CONCATENATION or len(op.inputs) <= MAX_CONCAT_INPUTS:
                continue
            out = sg.tensors[op.outputs[0]]
            axis = op.builtinOptions.axis if op.builtinOptions else 0
            axis = axis + len(out.shape) if axis < 0 else axis
            inputs, new = list(op.inputs), []
            while len(inputs) > MAX_CONCAT_INPUTS:
                grouped = []
                for i in range(0, len(inputs), CONCAT_GROUP):
                    part = inputs[i:i + CONCAT_GROUP]
                    if len(part) == 1:
                        grouped.append(part[0])
                        continue
                    shape = list(sg.tensors[part[0]].shape)
                    shape[axis] = sum(int(sg.tensors[t].shape[axis]) for t in part)
                    t = g.tensor(f"{out.name.decode()}/group{len(new)}", shape, out.type, None, out.quantization)
                    opts = schema.ConcatenationOptionsT()
                    opts.axis = axis
                    new.append(g.op(_B.CONCATENATION, part, [t], schema.BuiltinOptions.ConcatenationOptions, opts))
                    grouped.append(t)
                inputs = grouped
            at = sg.operators.index(op)
            sg.operators[at:at] = new
            op.inputs = inputs
            n += 1
    return (bytes(flatbuffer_utils.convert_object_to_bytearray(obj)), n) if n else (model, 0)


def _act(x: np.ndarray, fused: int) -> np.ndarray:
    """A fused activation (ADD/SUB/MUL/DIV options) applied to float values."""
    A = schema.ActivationFunctionType
    return {A.NONE: x, A.RELU: np.maximum(x, 0), A.RELU6: np.clip(x, 0, 6), A.RELU_N1_TO_1: np.clip(x, -1, 1),
            A.TANH: np.tanh(x)}.get(fused, None)


def _binary(f):
    def run(v, op):
        out = f(v[0], v[1])
        fused = getattr(op.builtinOptions, "fusedActivationFunction", 0) if op.builtinOptions else 0
        return _act(out, fused)
    return run


# op -> f(values of its inputs (float64; bool for conditions), op): the elementwise ops a chain may hold.
# QUANTIZE / DEQUANTIZE are the identity on values: the table is the rounding of the exact chain, as
# PyTorch computes it, not of each int8 step.
_ELEMENTWISE = {
    _B.DEQUANTIZE: lambda v, op: v[0], _B.QUANTIZE: lambda v, op: v[0],
    _B.ADD: _binary(np.add), _B.SUB: _binary(np.subtract), _B.MUL: _binary(np.multiply),
    _B.DIV: _binary(np.divide), _B.MAXIMUM: lambda v, op: np.maximum(v[0], v[1]),
    _B.MINIMUM: lambda v, op: np.minimum(v[0], v[1]), _B.POW: lambda v, op: np.power(v[0], v[1]),
    _B.EXP: lambda v, op: np.exp(v[0]), _B.LOG: lambda v, op: np.log(v[0]), _B.TANH: lambda v, op: np.tanh(v[0]),
    _B.LOGISTIC: lambda v, op: 1 / (1 + np.exp(-v[0])), _B.NEG: lambda v, op: -v[0],
    _B.SQUARE: lambda v, op: v[0] * v[0], _B.ABS: lambda v, op: np.abs(v[0]),
    _B.SQRT: lambda v, op: np.sqrt(np.maximum(v[0], 0)), _B.RSQRT: lambda v, op: 1 / np.sqrt(v[0]),
    _B.RELU: lambda v, op: np.maximum(v[0], 0), _B.RELU6: lambda v, op: np.clip(v[0], 0, 6),
    _B.RELU_N1_TO_1: lambda v, op: np.clip(v[0], -1, 1),
    _B.LEAKY_RELU: lambda v, op: np.where(v[0] >= 0, v[0], v[0] * op.builtinOptions.alpha),
    _B.HARD_SWISH: lambda v, op: v[0] * np.clip(v[0] + 3, 0, 6) / 6,
    _B.GELU: lambda v, op: _TABLED[_B.GELU](v[0], op),
    _B.GREATER: lambda v, op: v[0] > v[1], _B.GREATER_EQUAL: lambda v, op: v[0] >= v[1],
    _B.LESS: lambda v, op: v[0] < v[1], _B.LESS_EQUAL: lambda v, op: v[0] <= v[1],
    _B.EQUAL: lambda v, op: v[0] == v[1], _B.NOT_EQUAL: lambda v, op: v[0] != v[1],
    _B.SELECT: lambda v, op: np.where(v[0], v[1], v[2]), _B.SELECT_V2: lambda v, op: np.where(v[0], v[1], v[2]),
    _B.LOGICAL_AND: lambda v, op: np.logical_and(v[0], v[1]), _B.LOGICAL_OR: lambda v, op: np.logical_or(v[0], v[1]),
    _B.LOGICAL_NOT: lambda v, op: np.logical_not(v[0]),
}
# what makes a chain worth tabulating: an op TFLM does not register, or any float32 tensor in it
_NOT_IN_TFLM = {_B.SELECT}


def _constant(g: _Graph, tensor: int) -> float | None:
    """A constant tensor's one value (dequantized; every element equal), else None."""
    t = g.sg.tensors[tensor]
    buf = g.obj.buffers[t.buffer] if t.buffer < len(g.obj.buffers) else None
    if buf is None or buf.data is None or len(buf.data) == 0 or g.producer(tensor) is not None:
        return None
    dtype = {_FLOAT32: np.float32, _INT8: np.int8, _INT32: np.int32, schema.TensorType.BOOL: np.bool_,
             schema.TensorType.INT16: np.int16}.get(t.type)
    if dtype is None:
        return None
    vals = np.frombuffer(bytes(np.asarray(buf.data, np.uint8)), dtype).astype(np.float64)
    if vals.size == 0 or not np.all(vals == vals.flat[0]):
        return None  # per-channel constants (a PReLU's slopes) need one table per channel
    v = float(vals.flat[0])
    q = t.quantization
    if t.type == _INT8 and q is not None and q.scale is not None and len(q.scale):
        v = float(q.scale[0]) * (v - int(q.zeroPoint[0]))
    return v


def _chain(g: _Graph, root: int) -> tuple[list, int, list] | None:
    """The elementwise ops fed only by `root` (and scalar constants), in graph order, the one tensor
    they hand to the rest of the graph, and the QUANTIZEs to feed from it afterwards (int8 -> int8);
    None when they hand over several tensors or none."""
    have, ops = {root}, []
    for op in g.sg.operators:  # graph order is topological
        if g.code(op) not in _ELEMENTWISE or len(op.outputs) != 1:
            continue
        ins = [i for i in op.inputs if i >= 0]
        fed = [i for i in ins if i in have]
        if fed and all(i in have or _constant(g, i) is not None for i in ins):
            ops.append(op)
            have.add(op.outputs[0])

    def handed_by(chain):
        inside = {id(o) for o in chain}
        return {o.outputs[0] for o in chain
                if g.is_output(o.outputs[0]) or any(id(c) not in inside for c in g.consumers(o.outputs[0]))}

    handed = handed_by(ops)
    # A U-Net's skip reads the activation twice, at two scales (the next conv's, the concatenation's).
    # Either the chain's float end is quantized twice, or its int8 end is requantized (int8 -> int8
    # QUANTIZE). The table writes one end; the other QUANTIZEs stay outside it, requantizing that.
    ends = [o for o in ops if o.outputs[0] in handed]
    if len(ends) > 1 and all(g.code(o) == _B.QUANTIZE and o.inputs[0] == ends[0].inputs[0] for o in ends):
        return [o for o in ops if not any(o is e for e in ends[1:])], ends[0].outputs[0], ends[1:]
    tails = [o for o in ends if g.code(o) == _B.QUANTIZE and o.inputs[0] in handed]
    if len(handed) > 1 and tails:
        kept = [o for o in ops if not any(o is t for t in tails)]
        if len(handed_by(kept)) == 1:
            return kept, handed_by(kept).pop(), []  # the requantizing QUANTIZEs read the table's output as is
    return (ops, handed.pop(), []) if len(handed) == 1 else None


def _chain_root(g: _Graph, op) -> int | None:
    """The one non-constant tensor the elementwise ops above `op` start from, else None."""
    roots, todo, seen = set(), [op], set()
    while todo:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        for i in o.inputs:
            if i < 0 or _constant(g, i) is not None:
                continue
            p = g.producer(i)
            if p is not None and g.code(p) in _ELEMENTWISE and len(p.outputs) == 1:
                todo.append(p)
            else:
                roots.add(i)
    return roots.pop() if len(roots) == 1 else None


def activations_as_table(model: bytes) -> tuple[bytes, dict[str, int]]:
    """Each chain of elementwise ops from one int8 tensor to one int8 tensor that TFLM cannot run as
    written (a float32 tensor inside, or SELECT) as one 256-entry table lookup (CAST, ADD, GATHER)
    holding the int8 rounding of the whole chain's exact value; -> (the model, {chain's ops: count})."""
    obj = flatbuffer_utils.read_model_from_bytearray(bytearray(model))
    done: dict[str, int] = {}
    names = {v: k for k, v in vars(_B).items() if not k.startswith("_")}
    for sg in obj.subgraphs:
        g = _Graph(obj, sg)
        tried: set[int] = set()
        for op in list(sg.operators):
            if op not in sg.operators or g.code(op) not in _ELEMENTWISE:
                continue
            bad = g.code(op) in _NOT_IN_TFLM or any(sg.tensors[i].type == _FLOAT32 for i in op.outputs)
            root = _chain_root(g, op) if bad else None
            if root is None or root in tried or _qparams(sg.tensors[root]) is None:
                continue
            tried.add(root)
            found = _chain(g, root)
            if found is None:
                continue
            ops, y, requantize = found
            in_q, out_q = _qparams(sg.tensors[root]), _qparams(sg.tensors[y])
            if out_q is None:
                continue
            values = {root: in_q[0] * (np.arange(-128, 128, dtype=np.float64) - in_q[1])}
            with np.errstate(all="ignore"):
                for o in ops:
                    args = [values[i] if i in values else _constant(g, i) for i in o.inputs if i >= 0]
                    values[o.outputs[0]] = _ELEMENTWISE[g.code(o)](args, o)
            f = np.asarray(values[y], np.float64)
            if f is None or f.shape != (256,) or not np.all(np.isfinite(f)):
                continue  # a chain whose value is not finite on every code (log of 0): left as it is
            new = _table_lookup(g, root, y, f, out_q)
            at = min(sg.operators.index(o) for o in ops)
            for o in ops:
                sg.operators.remove(o)
            sg.operators[at:at] = new
            for o in requantize:
                o.inputs = [y]
            key = "+".join(dict.fromkeys(names.get(g.code(o), "?") for o in ops
                                         if g.code(o) not in (_B.QUANTIZE, _B.DEQUANTIZE)))
            done[key] = done.get(key, 0) + 1
        _drop_unused_tensors(obj, sg)
    return (bytes(flatbuffer_utils.convert_object_to_bytearray(obj)), done) if done else (model, {})


METADATA = "tpu_pipeline.tflm_int8"  # the model's metadata entry: JSON {op: count} of what was rewritten


def for_tflm(model: bytes) -> bytes:
    """Both rewrites, with what they changed recorded in the model's metadata (`notes` reads it)."""
    root = schema.Model.GetRootAs(model, 0)
    codes = {max(root.OperatorCodes(i).BuiltinCode(), root.OperatorCodes(i).DeprecatedBuiltinCode())
             for i in range(root.OperatorCodesLength())}
    if not codes & (set(NAMES) | {_B.DEQUANTIZE, _B.CONCATENATION} | _NOT_IN_TFLM):  # most models: nothing to do
        return model
    model, n_max = reduce_max_in_int8(model)
    model, tabled = elementwise_as_table(model)
    model, n_leaky = leaky_relu_in_int8(model)
    model, chains = activations_as_table(model)
    model, n_concat = concatenations_in_groups(model)
    done = {**({"REDUCE_MAX": n_max} if n_max else {}), **tabled, **({"LEAKY_RELU": n_leaky} if n_leaky else {}),
            **chains, **({"CONCATENATION": n_concat} if n_concat else {})}
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
    "LEAKY_RELU": "LEAKY_RELU runs int8 in TFLM (the quantizer left it float32)",
    "CONCATENATION": (f"CONCATENATION of more than {MAX_CONCAT_INPUTS} inputs in groups of {CONCAT_GROUP}: TFLM's "
                      f"kernel takes at most {MAX_CONCAT_INPUTS}"),
}


def rewrites(model: bytes) -> dict[str, int]:
    """{op: count} that `for_tflm` rewrote in this model; {} for any other model."""
    root = schema.Model.GetRootAs(model, 0)
    for i in range(root.MetadataLength()):
        m = root.Metadata(i)
        if m.Name() == METADATA.encode():
            return json.loads(root.Buffers(m.Buffer()).DataAsNumpy().tobytes())
    return {}


def _note(op: str) -> str:
    return _NOTE.get(op) or (f"{op} as one int8 table (CAST, ADD, GATHER): the chain ran part float32 or through "
                             "an op TFLM lacks; the table is the int8 rounding of its exact value")


def notes(model: bytes) -> list[str]:
    """One report note per rewritten op kind (the rewrite named, with its count and why)."""
    return [f"static int8 for TFLM: {n} {_note(op)} (convert/precision/tflm_int8.py)" for op, n in sorted(rewrites(model).items())]
