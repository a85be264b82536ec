"""Rewrites of a .tflite flatbuffer that quantize.py applies to every static int8
(full-integer, the iot target's) variant, whatever the model kind.

Embeddings as GATHER. litert-torch lowers nn.Embedding (aten.embedding) to
EMBEDDING_LOOKUP, which ai-edge-quantizer's static int8 recipe does not
quantize: its table stays float32 and TFLM then needs a float kernel. TFLite's
GATHER along axis 0 is the same lookup (output = ids.shape + table.shape[1:],
the same rows copied), and GATHER the recipe quantizes (the table's int8 scale
carries to the output) and TFLM runs in int8. `lookups_as_gather` swaps one
for the other in the .tflite, so it works for every model source (nn.Module,
ExportedProgram, .pt2) and is exact in float.

Weights inside the flatbuffer, as TFLM reads them. ai-edge-quantizer (0.10)
writes a model whose constant data reaches 256 KiB with external buffers: the
data after the flatbuffer, each Buffer holding an offset and a size. LiteRT
reads those; the TFLM interpreter does not: it takes such a tensor for an
activation and plans it into the arena (measured: a 5000 x 64 int8 embedding
table asked for 334464 arena bytes and did not fit 256 KiB). `inline_buffers`
writes the same model with every buffer's data in the flatbuffer, as models
under 256 KiB already are.
"""

from __future__ import annotations

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.tools import flatbuffer_utils


def lookups_as_gather(model: bytes) -> bytes:
    """The .tflite with every EMBEDDING_LOOKUP(ids, table) replaced by GATHER(table, ids, axis=0);
    the bytes unchanged when there is none. The lookup's operator code becomes GATHER's in place,
    so no EMBEDDING_LOOKUP code is left behind for an interpreter to look up (TFLite's calibrator
    registers every code in the table, and has no EMBEDDING_LOOKUP)."""
    lookup = schema.BuiltinOperator.EMBEDDING_LOOKUP
    obj = flatbuffer_utils.read_model_from_bytearray(bytearray(model))
    codes = [flatbuffer_utils.get_builtin_code_from_operator_code(c) for c in obj.operatorCodes or []]
    if lookup not in codes:
        return model
    for i, c in enumerate(codes):
        if c == lookup:
            # GATHER (36) fits the deprecated int8 field too; readers take the larger of the two
            code = obj.operatorCodes[i]
            code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.GATHER
            code.version = 1
    for subgraph in obj.subgraphs:
        for op in subgraph.operators:
            if codes[op.opcodeIndex] != lookup:
                continue
            ids, table = op.inputs
            op.inputs = [table, ids]
            op.builtinOptionsType = schema.BuiltinOptions.GatherOptions
            op.builtinOptions = schema.GatherOptionsT(axis=0, batchDims=0)
    return bytes(flatbuffer_utils.convert_object_to_bytearray(obj))


def has_external_buffers(model: bytes) -> bool:
    root = schema.Model.GetRootAs(model, 0)
    return any(root.Buffers(i).Offset() > 0 for i in range(root.BuffersLength()))


def inline_buffers(model: bytes) -> bytes:
    """The model with external buffers moved into the flatbuffer; the bytes unchanged when it has none.
    Flatbuffers cap a file at 2 GiB, far beyond what a microcontroller takes."""
    if not has_external_buffers(model):
        return model
    obj = flatbuffer_utils.read_model_from_bytearray(bytearray(model))  # resolves offsets into data
    for buf in obj.buffers or []:
        if buf.data is not None and not isinstance(buf.data, np.ndarray):
            # numpy data packs as one vector; a bytes slice packs byte by byte in Python
            buf.data = np.frombuffer(bytes(buf.data), np.uint8)
    return bytes(flatbuffer_utils.convert_object_to_bytearray(obj))
