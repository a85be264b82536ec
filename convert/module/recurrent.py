"""nn.LSTM exported as TFLite's fused UNIDIRECTIONAL_SEQUENCE_LSTM, one op per layer and direction.

litert-torch 0.10 lowers `nn.LSTM` to basic ops unrolled over time (its issue #53): a 3-layer,
256-unit speaker encoder became 7,691 ops, took 38 s to export and ran 0.43x PyTorch eager. At
export, `as_fused` swaps each nn.LSTM, in a copy of the module, for `FusedLSTM`, which calls one
custom op per layer and direction; its lowering (registered in litert-torch's own lowering
registry, the way litert-torch lowers its MoE op to `tfl.custom`) emits
`tfl.unidirectional_sequence_lstm` with the weights as constant inputs in TFLite's 24-input order:
the gates split from PyTorch's stacked i, f, g, o (TFLite names g the cell gate), the two PyTorch
biases summed, `time_major` for batch_first=False. The converter then writes the builtin
directly: no flatbuffer rewrite.

A reverse direction is the same op on the time-reversed sequence (REVERSE_V2), its output
reversed back and concatenated: TFLite's BIDIRECTIONAL_SEQUENCE_LSTM has no TFLM kernel
(tflite-micro registers the unidirectional one only), two unidirectional ops run wherever one does.

The fused op's state is TFLite's variable tensors: zero when the interpreter allocates, and
carried from one invoke to the next (the runtime does not reset it). `FusedLSTM` keeps every run
independent, as PyTorch's is: each LSTM op is followed by a one-step LSTM over the same state
whose gates are shut (zero weights, bias RESET_BIAS), which writes zeros into both state
tensors; `reset_states` adds those ops to the .tflite after export (see its docstring).

What stays unrolled (as litert-torch lowers it, with the reason in the report's notes): an
initial state (h0, c0) passed by the model, proj_size > 0, and a model whose output reads c_n
(the fused op outputs the hidden sequence only; h_n is its last step). Each is found by running
the copy against the original on the sample inputs, where c_n is NaN: a copy that departs is
dropped.
"""

from __future__ import annotations

import copy
import functools

import torch
from torch import nn

from tpu_pipeline.convert.module.gru import FusedGRU
from tpu_pipeline.convert.module.rnn_weights import layer_weights

OP_NAME = "tpu_pipeline::lstm_layer"
# a candidate precision's suffix: the variant derives from the unfused export. LiteRT.js (web) and
# LiteRT's CompiledModel refuse variable tensors ("Variable tensors not yet supported"), the fused op's state.
UNROLLED = "+unrolled"


@torch.library.custom_op(OP_NAME, mutates_args=())
def lstm_layer(x: torch.Tensor, w_i: torch.Tensor, w_f: torch.Tensor, w_c: torch.Tensor, w_o: torch.Tensor,
               r_i: torch.Tensor, r_f: torch.Tensor, r_c: torch.Tensor, r_o: torch.Tensor, b_i: torch.Tensor,
               b_f: torch.Tensor, b_c: torch.Tensor, b_o: torch.Tensor, time_major: bool) -> torch.Tensor:
    """One LSTM layer, one direction, zero initial state: x [B, T, F] ([T, B, F] when time_major)
    -> the hidden sequence [B, T, H]. Weights per gate (TFLite's split), biases summed."""
    w_ih, w_hh, b = torch.cat([w_i, w_f, w_c, w_o]), torch.cat([r_i, r_f, r_c, r_o]), torch.cat([b_i, b_f, b_c, b_o])
    batch = x.shape[1] if time_major else x.shape[0]
    zero = x.new_zeros(1, batch, w_i.shape[0])
    return torch._VF.lstm(x, (zero, zero), [w_ih, w_hh, b, torch.zeros_like(b)], True, 1, 0.0, False, False,
                          not time_major)[0]


@lstm_layer.register_fake
def _(x, w_i, *_rest):
    return x.new_empty((*x.shape[:-1], w_i.shape[0]))


_LOWERED = False


def register_lowering() -> None:
    """Teaches litert-torch to lower the op to the builtin; called by the export, once."""
    global _LOWERED
    if _LOWERED:
        return
    # heavy (the TFLite converter stack, ~8 s): only an export needs it
    from litert_converter.mlir import ir
    from litert_torch.backend import lowerings
    from litert_torch.backend.lowerings import utils as lowering_utils

    @lowerings.lower(torch.ops.tpu_pipeline.lstm_layer)
    def _lower(lctx, x, w_i, w_f, w_c, w_o, r_i, r_f, r_c, r_o, b_i, b_f, b_c, b_o, time_major):
        results = lowering_utils.node_meta_to_ir_types(lctx.node)
        hidden, batch = results[0].shape[-1], results[0].shape[1 if time_major else 0]

        def none():  # an absent optional input (-1 in the flatbuffer)
            return ir.Operation.create("tfl.no_value", results=[ir.NoneType.get()],
                                       attributes={"value": ir.UnitAttr.get()}).results[0]

        def zero_state():  # a constant the converter turns into the op's variable state tensor
            ty = ir.RankedTensorType.get([batch, hidden], ir.F32Type.get())
            return ir.Operation.create("arith.constant", results=[ty], attributes={
                "value": ir.DenseElementsAttr.get_splat(ty, ir.FloatAttr.get(ir.F32Type.get(), 0.0))}).results[0]

        # TFLite's 24 inputs: input; 4 input and 4 recurrent weights; 3 peepholes; 4 gate biases;
        # projection weight and bias; output and cell state; 4 layer-norm coefficients
        operands = [x, w_i, w_f, w_c, w_o, r_i, r_f, r_c, r_o, none(), none(), none(), b_i, b_f, b_c, b_o,
                    none(), none(), zero_state(), zero_state(), none(), none(), none(), none()]
        f32 = ir.F32Type.get()
        op = ir.Operation.create("tfl.unidirectional_sequence_lstm", results=results, operands=operands, attributes={
            "fused_activation_function": ir.StringAttr.get("TANH"), "cell_clip": ir.FloatAttr.get(f32, 0.0),
            "proj_clip": ir.FloatAttr.get(f32, 0.0), "time_major": ir.BoolAttr.get(bool(time_major))})
        return op.results[0]

    _LOWERED = True


class FusedLSTM(nn.Module):
    """An nn.LSTM (any layers, directions, batch_first) as one fused op per layer and direction.
    Same outputs as the original, except c_n (NaN: the fused op does not output it); an initial
    state given at call time runs the original, unrolled."""

    def __init__(self, lstm: nn.LSTM):
        super().__init__()
        self.original = lstm  # runs when the caller passes (h0, c0)
        self.batch_first, self.hidden = lstm.batch_first, lstm.hidden_size
        self.layers, self.directions = lstm.num_layers, 2 if lstm.bidirectional else 1
        self.fell_back = False
        h = lstm.hidden_size
        for sfx, w, r, bi, bh in layer_weights(lstm):
            b = bi + bh
            for k, gate in enumerate("ifco"):  # PyTorch stacks i, f, g, o: TFLite's cell gate is g
                self.register_buffer(f"w_{gate}{sfx}", w[k * h:(k + 1) * h].clone())
                self.register_buffer(f"r_{gate}{sfx}", r[k * h:(k + 1) * h].clone())
                self.register_buffer(f"b_{gate}{sfx}", b[k * h:(k + 1) * h].clone())

    def _direction(self, x: torch.Tensor, sfx: str) -> torch.Tensor:
        g = {name: getattr(self, f"{name}{sfx}") for name in (f"{k}_{gate}" for k in "wrb" for gate in "ifco")}
        return torch.ops.tpu_pipeline.lstm_layer(
            x, g["w_i"], g["w_f"], g["w_c"], g["w_o"], g["r_i"], g["r_f"], g["r_c"], g["r_o"],
            g["b_i"], g["b_f"], g["b_c"], g["b_o"], not self.batch_first)

    def forward(self, x: torch.Tensor, hx=None):
        if hx is not None:
            self.fell_back = True
            return self.original(x, hx)
        unbatched = x.dim() == 2
        if unbatched:
            x = x.unsqueeze(0 if self.batch_first else 1)
        t_axis = 1 if self.batch_first else 0
        steps = x.shape[t_axis]
        last = []
        for layer in range(self.layers):
            outs = []
            for d in range(self.directions):
                sfx = f"_l{layer}" + ("_reverse" if d else "")
                if d:  # the reverse direction reads the sequence backwards (REVERSE_V2: XNNPACK, TFLM)
                    y = self._direction(x.flip(t_axis), sfx)
                    last.append(y.select(t_axis, steps - 1))
                    y = y.flip(t_axis)
                else:
                    y = self._direction(x, sfx)
                    last.append(y.select(t_axis, steps - 1))
                outs.append(y)
            x = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        h_n = torch.stack(last)
        c_n = torch.full_like(h_n, float("nan"))  # not produced by the fused op: a model that reads it is refused
        if unbatched:
            x, h_n, c_n = x.squeeze(0 if self.batch_first else 1), h_n.squeeze(1), c_n.squeeze(1)
        return x, (h_n, c_n)


def _fusable(m: nn.Module) -> bool:
    return (type(m) is nn.LSTM and m.proj_size == 0) or type(m) is nn.GRU


def as_fused(module: nn.Module, sample_args) -> tuple[nn.Module, list[str]]:
    """-> (the module to export, report notes). Each nn.LSTM becomes FusedLSTM and each nn.GRU
    gru.FusedGRU, in a copy; the module itself when it has neither, or when the copy does not
    reproduce it on the sample inputs (the note says why)."""
    if isinstance(module, torch.fx.GraphModule):
        new, names, notes = _swap_graph(module)
    else:
        new, names, notes = _swap_modules(module)
    if new is module:
        return module, notes
    with torch.no_grad():
        want, got = module(*sample_args), new(*sample_args)
    flat = [(a, b) for a, b in zip(torch.utils._pytree.tree_leaves(want), torch.utils._pytree.tree_leaves(got))
            if isinstance(a, torch.Tensor) and a.is_floating_point()]
    lstms = [n for n in names if isinstance(new.get_submodule(n), FusedLSTM)]
    grus = [n for n in names if n not in lstms]
    fell_back = [n for n in names if new.get_submodule(n).fell_back]
    if not flat or not all(torch.allclose(a, b, rtol=1e-4, atol=1e-5 * float(a.abs().max()) + 1e-6) for a, b in flat):
        return module, notes + [f"nn.LSTM {', '.join(lstms)} exported unrolled over time (litert-torch's lowering): "
                                "the model reads the cell state c_n, which TFLite's fused LSTM does not output"]
    if fell_back:
        return module, notes + [f"{', '.join(fell_back)} exported unrolled over time (litert-torch's lowering): the "
                                "model passes an initial state, which TFLite's fused LSTM takes only as zeros"]
    if lstms:
        notes.append(f"{len(lstms)} nn.LSTM ({', '.join(lstms)}) exported as TFLite's fused "
                     "UNIDIRECTIONAL_SEQUENCE_LSTM, one op per layer and direction (a reverse direction reads "
                     "the sequence through REVERSE_V2), each followed by a one-step LSTM that zeroes its state "
                     "for the next invoke: litert-torch unrolls it over time (its issue #53)")
    if grus:
        notes.append(f"{len(grus)} nn.GRU ({', '.join(grus)}) exported unrolled with the input projection done once "
                     "and two FULLY_CONNECTED a step (TFLite has no fused GRU): litert-torch's own unrolling cuts "
                     "the gates out with SLICE ops")
    return new, notes


def _swap_modules(module: nn.Module) -> tuple[nn.Module, list[str], list[str]]:
    """-> (a copy with each nn.LSTM / nn.GRU swapped, or `module`; the swapped names; notes)."""
    names = [name for name, m in module.named_modules() if _fusable(m)]
    skipped = [name for name, m in module.named_modules() if type(m) is nn.LSTM and not _fusable(m)]
    notes = [f"nn.LSTM {n or '(the model)'} has proj_size > 0: exported unrolled over time (litert-torch's "
             "lowering)" for n in skipped]
    if not names:
        return module, [], notes
    if names == [""]:
        return module, [], notes + [
            "the model is an nn.LSTM/nn.GRU itself (a tuple output with its state): exported unrolled over time; "
            "wrap it in a module that returns what it uses to export it fused"]
    new = copy.deepcopy(module)
    for name in names:
        parent, _, leaf = name.rpartition(".")
        holder = new.get_submodule(parent)
        old = getattr(holder, leaf)
        setattr(holder, leaf, FusedLSTM(old) if type(old) is nn.LSTM else FusedGRU(old))
    return new, names, notes


class _GraphLSTM(FusedLSTM):
    """FusedLSTM in an exported graph, in place of aten.lstm.input: a flat (output, h_n, c_n)."""

    def forward(self, x):
        y, (h, c) = super().forward(x)
        return y, h, c


def _swap_graph(gm: torch.fx.GraphModule) -> tuple[nn.Module, list[str], list[str]]:
    """An exported program's aten.lstm (a .pt2, torch.export): each one with a zero initial state
    (aten.zeros) and constant weights becomes a _GraphLSTM submodule, in a copy."""
    found = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.lstm.input]
    if not found:
        return gm, [], []
    gm = copy.deepcopy(gm)
    names, notes = [], []
    for i, n in enumerate(n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.lstm.input):
        x, hx, params, has_biases, layers, _dropout, _train, bidirectional, batch_first = n.args
        per = 4 if has_biases else 2
        if not all(getattr(h, "target", None) is torch.ops.aten.zeros.default for h in hx) \
                or not all(getattr(p, "op", None) == "get_attr" for p in params) \
                or len(params) != per * layers * (2 if bidirectional else 1):
            notes.append(f"aten.lstm {n.name} exported unrolled over time (litert-torch's lowering): its initial "
                         "state is not zeros, its weights are not constants or it has a projection")
            continue
        weights = [functools.reduce(getattr, p.target.split("."), gm) for p in params]
        lstm = nn.LSTM(weights[0].shape[1], weights[1].shape[1], num_layers=layers, bias=has_biases,
                       batch_first=batch_first, bidirectional=bidirectional)
        with torch.no_grad():
            for w, name in zip(weights, [k for k in lstm._flat_weights_names]):
                getattr(lstm, name).copy_(w)
        name = f"fused_lstm_{i}"
        gm.add_submodule(name, _GraphLSTM(lstm.eval()))
        with gm.graph.inserting_before(n):
            call = gm.graph.call_module(name, (x,))
        call.meta = dict(n.meta)
        n.replace_all_uses_with(call)
        gm.graph.erase_node(n)
        names.append(name)
    if not names:
        return found[0].graph.owning_module, [], notes
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm, names, notes
