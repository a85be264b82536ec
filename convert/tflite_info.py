"""What a .tflite holds: signature inputs/outputs (with quantization), ops in
execution order, tensors, and the PyTorch module path behind each tensor.

litert-torch names tensors after the module scope they came from, e.g.
`pkg.Net/torch.nn.modules.container.Sequential_blocks/torch.nn.modules.conv.Conv2d_3;1`
-> module path `blocks.3`.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
from ai_edge_litert.interpreter import Interpreter

from tpu_pipeline.errors import ConversionError


@dataclasses.dataclass(kw_only=True)
class IOTensor:
    key: str                 # signature name (args_0, output_0)
    tensor_index: int
    position: int            # position among the subgraph's inputs/outputs (TFLM feeds by position)
    name: str
    shape: list[int]
    shape_signature: list[int]
    dtype: str
    scale: float
    zero_point: int

    def to_json(self) -> dict:
        d = {"signature_key": self.key, "tensor": self.name, "shape": self.shape, "dtype": self.dtype}
        if self.shape_signature != self.shape:
            d["shape_signature"] = self.shape_signature
        d["quantization"] = {"scale": self.scale, "zero_point": self.zero_point} if self.scale else None
        return d


@dataclasses.dataclass(kw_only=True)
class ModelInfo:
    inputs: list[IOTensor]
    outputs: list[IOTensor]
    ops: list[dict]          # {"index", "op", "inputs", "outputs"} in execution order
    tensors: dict[int, dict]  # index -> {"name", "shape", "shape_signature", "dtype", "constant"}


def _suffix_num(key: str) -> tuple:
    m = re.search(r"(\d+)$", key)
    return (int(m.group(1)) if m else 0, key)


def inspect_model(model: bytes) -> ModelInfo:
    try:
        it = Interpreter(model_content=model)
    except ValueError as e:
        # Seen: ai-edge-quantizer's static int8 of a ConvNeXt wrote per-axis scales on a
        # per-layer tensor; the interpreter refuses such a file. That target fails, not the call.
        first = " ".join(str(e).split())[:300]
        raise ConversionError(f"the artifact does not load in the LiteRT interpreter: {first}") from None
    sig = it._get_full_signature_list()["serving_default"] if "serving_default" in it.get_signature_list() else None
    in_det, out_det = it.get_input_details(), it.get_output_details()
    tensors = {}
    for t in it.get_tensor_details():
        tensors[t["index"]] = {"name": t["name"], "shape": t["shape"].tolist(),
                               "shape_signature": t["shape_signature"].tolist(),
                               "dtype": np.dtype(t["dtype"]).name,
                               "scale": float(t["quantization"][0]), "zero_point": int(t["quantization"][1])}

    def io(details, keyed):
        pos = {d["index"]: i for i, d in enumerate(details)}
        if keyed is None:
            keyed = {f"{i}": d["index"] for i, d in enumerate(details)}
        rows = []
        for key in sorted(keyed, key=_suffix_num):
            idx = keyed[key]
            d = details[pos[idx]]
            scale, zp = d["quantization"]
            rows.append(IOTensor(key=key, tensor_index=idx, position=pos[idx], name=d["name"],
                                 shape=d["shape"].tolist(), shape_signature=d["shape_signature"].tolist(),
                                 dtype=np.dtype(d["dtype"]).name, scale=float(scale), zero_point=int(zp)))
        return rows

    inputs = io(in_det, sig["inputs"] if sig else None)
    outputs = io(out_det, sig["outputs"] if sig else None)
    ops = [{"index": o["index"], "op": o["op_name"], "inputs": [int(i) for i in o["inputs"] if i >= 0],
            "outputs": [int(i) for i in o["outputs"]]} for o in it._get_ops_details()]
    produced = {i for o in ops for i in o["outputs"]} | {t.tensor_index for t in inputs}
    for idx, t in tensors.items():
        t["constant"] = idx not in produced
    return ModelInfo(inputs=inputs, outputs=outputs, ops=ops, tensors=tensors)


def module_path(tensor_name: str) -> str | None:
    """Deepest PyTorch module path named in a litert-torch tensor name, or None."""
    best: list[str] = []
    for segment in tensor_name.split(";"):
        parts = segment.split("/")
        if len(parts) < 2:
            continue
        attrs = []
        for p in parts[1:]:
            last = p.rsplit(".", 1)[-1].lstrip("_")
            _, sep, attr = last.partition("_")
            if not sep or not attr:
                break
            attrs.append(attr)
        if len(attrs) > len(best):
            best = attrs
    return ".".join(best) if best else None


def op_module(info: ModelInfo, op: dict) -> str | None:
    """Module path for an op: from its outputs' names, else its constant inputs (weights)."""
    for idx in op["outputs"] + [i for i in op["inputs"] if info.tensors.get(i, {}).get("constant")]:
        path = module_path(info.tensors.get(idx, {}).get("name", ""))
        if path:
            return path
    return None


def arena_estimate(info: ModelInfo) -> int:
    """Peak bytes of simultaneously live activation tensors in execution order (TFLM plans
    a similar greedy layout; the real interpreter's run is the final word)."""
    last_use: dict[int, int] = {}
    for step, op in enumerate(info.ops):
        for i in op["inputs"] + op["outputs"]:
            last_use[i] = step
    for t in info.outputs:
        last_use[t.tensor_index] = len(info.ops)

    def nbytes(i):
        t = info.tensors[i]
        return int(np.prod([max(d, 1) for d in t["shape"]] or [1])) * np.dtype(t["dtype"]).itemsize

    live = {t.tensor_index for t in info.inputs}
    peak = sum(nbytes(i) for i in live)
    for step, op in enumerate(info.ops):
        live |= {i for i in op["outputs"] if not info.tensors[i]["constant"]}
        peak = max(peak, sum(nbytes(i) for i in live))
        live = {i for i in live if last_use.get(i, -1) > step}
    return peak
