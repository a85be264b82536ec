"""Weights inside the flatbuffer, as TFLM reads them.

ai-edge-quantizer (0.10) writes a model whose constant data reaches 256 KiB
with external buffers: the data after the flatbuffer, each Buffer holding an
offset and a size. LiteRT reads those; the TFLM interpreter does not: it takes
such a tensor for an activation and plans it into the arena (measured: a
5000 x 64 int8 embedding table asked for 334464 arena bytes and did not fit
256 KiB). `inline_buffers` writes the same model with every buffer's data in
the flatbuffer, as models under 256 KiB already are.
"""

from __future__ import annotations

import numpy as np


def has_external_buffers(model: bytes) -> bool:
    from ai_edge_litert import schema_py_generated as schema  # heavy-ish; only quantized variants need it

    root = schema.Model.GetRootAs(model, 0)
    return any(root.Buffers(i).Offset() > 0 for i in range(root.BuffersLength()))


def inline_buffers(model: bytes) -> bytes:
    """The model with external buffers moved into the flatbuffer; the bytes unchanged when it has none.
    Flatbuffers cap a file at 2 GiB, far beyond what a microcontroller takes."""
    if not has_external_buffers(model):
        return model
    from ai_edge_litert.tools import flatbuffer_utils

    obj = flatbuffer_utils.read_model_from_bytearray(bytearray(model))  # resolves offsets into data
    for buf in obj.buffers or []:
        if buf.data is not None and not isinstance(buf.data, np.ndarray):
            # numpy data packs as one vector; a bytes slice packs byte by byte in Python
            buf.data = np.frombuffer(bytes(buf.data), np.uint8)
    return bytes(flatbuffer_utils.convert_object_to_bytearray(obj))
