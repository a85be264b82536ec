"""Embeddings for full-integer (iot) artifacts.

litert-torch lowers nn.Embedding (aten.embedding) to EMBEDDING_LOOKUP, which
ai-edge-quantizer's static int8 recipe does not quantize: its table stays
float32 and TFLM then needs a float kernel. TFLite's GATHER along axis 0 is
the same lookup (output = ids.shape + table.shape[1:], the same rows copied),
and GATHER the recipe quantizes (the table's int8 scale carries to the output)
and TFLM runs in int8. `lookups_as_gather` swaps one for the other in the
.tflite, so it works for every model source (nn.Module, ExportedProgram,
.pt2) and is exact in float.

Random token ids for calibration and parity must stay inside the table:
`embedding_rows` records, during the loader's own forward run, per model
input, the row count of the embedding that reads that input directly.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator

import torch
from torch import nn


def lookups_as_gather(model: bytes) -> bytes:
    """The .tflite with every EMBEDDING_LOOKUP(ids, table) replaced by GATHER(table, ids, axis=0);
    the bytes unchanged when there is none."""
    # here, not at the top: the loaders import this module and need none of the flatbuffer stack
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.tools import flatbuffer_utils

    lookup, gather_code = schema.BuiltinOperator.EMBEDDING_LOOKUP, schema.BuiltinOperator.GATHER
    obj = flatbuffer_utils.read_model_from_bytearray(bytearray(model))
    codes = [flatbuffer_utils.get_builtin_code_from_operator_code(c) for c in obj.operatorCodes or []]
    if lookup not in codes:
        return model
    if gather_code in codes:
        gather = codes.index(gather_code)
    else:
        code = schema.OperatorCodeT()
        # GATHER (36) fits the deprecated int8 field too; readers take the larger of the two
        code.builtinCode = code.deprecatedBuiltinCode = gather_code
        code.version = 1
        obj.operatorCodes.append(code)
        gather = len(obj.operatorCodes) - 1
    for subgraph in obj.subgraphs:
        for op in subgraph.operators:
            if codes[op.opcodeIndex] != lookup:
                continue
            ids, table = op.inputs
            op.inputs = [table, ids]
            op.opcodeIndex = gather
            op.builtinOptionsType = schema.BuiltinOptions.GatherOptions
            op.builtinOptions = schema.GatherOptionsT(axis=0, batchDims=0)
    return bytes(flatbuffer_utils.convert_object_to_bytearray(obj))


@contextlib.contextmanager
def embedding_rows(module: nn.Module, sample_args: tuple) -> Iterator[list[int | None]]:
    """Around the caller's own forward run of `module` on `sample_args` (the loader runs it
    anyway): yields a list that holds, per input, after the block, the number of rows of the
    embedding table that input indexes directly (nn.Embedding called on it, or aten.embedding on
    it in an exported graph), else None. An input that goes through another op first (ids +
    offset, ids.long()) is not followed."""
    found: list[int | None] = [None] * len(sample_args)
    rows: dict[int, int] = {}
    positions = {id(a): i for i, a in enumerate(sample_args)
                 if isinstance(a, torch.Tensor) and not a.is_floating_point() and a.dtype != torch.bool}
    hooks = []
    if positions and isinstance(module, torch.fx.GraphModule):
        placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
        if len(placeholders) == len(sample_args):
            index = {n: i for i, n in enumerate(placeholders)}
            for n in module.graph.nodes:
                if n.op == "call_function" and n.target is torch.ops.aten.embedding.default \
                        and n.args[1] in index and getattr(n.args[0], "op", None) == "get_attr":
                    table = functools.reduce(getattr, n.args[0].target.split("."), module)
                    _narrow(rows, index[n.args[1]], int(table.shape[0]))
    if positions:
        def seen(emb, args):
            if args and id(args[0]) in positions:
                _narrow(rows, positions[id(args[0])], emb.num_embeddings)

        hooks = [m.register_forward_pre_hook(seen) for m in module.modules() if isinstance(m, nn.Embedding)]
    try:
        yield found
    finally:
        for h in hooks:
            h.remove()
        found[:] = [rows.get(i) for i in range(len(sample_args))]


def _narrow(rows: dict[int, int], position: int, n: int) -> None:
    """An input read by several tables must fit the smallest."""
    rows[position] = min(rows.get(position, n), n)
