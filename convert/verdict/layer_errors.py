"""Where the numbers go wrong, in the tool users already open: the per-layer error that
localization measured (parity.localize), written as a Model Explorer node-data overlay
(ai-edge-model-explorer's `GraphNodeData` JSON) beside the artifact it was measured on:

    model-explorer DIR/<target>/failed/model.tflite --node_data_paths DIR/<target>/failed/layer_errors.json

Each measured op is keyed by its first output tensor's name, which Model Explorer's TFLite
adapter shows as the node's `tensor_name` (the one key that needs no graph id: a model with
several signatures has several graphs). The value is the layer's relative error against
PyTorch; the colours are the localization's own bands, so red means "past the threshold the
verdict blamed", not a colour scale that any model fills."""

from __future__ import annotations

from tpu_pipeline.convert.tflite_info import ModelInfo

FILE = "layer_errors.json"
# Model Explorer colours a node by the first threshold its value is <= to; one above any error
# makes the last band cover everything past the localization's threshold.
GREEN, YELLOW, RED = "#a5d6a7", "#fff59d", "#ef9a9a"
BEYOND = 1e300


def overlay(loc: dict, info: ModelInfo) -> dict | None:
    """GraphNodeData for the layers of a localization (`{"layers": [...], "threshold": t}`), keyed
    by tensor names of `info` (the artifact the layers were measured on); None when no measured
    layer names a tensor (nothing to show)."""
    results, seen = {}, set()
    for row in loc.get("layers") or []:
        op = info.ops[row["op_index"]] if 0 <= row["op_index"] < len(info.ops) else None
        name = info.tensors.get(op["outputs"][0], {}).get("name") if op and op["outputs"] else None
        if not name or name in seen:
            continue  # a name two ops share would colour the wrong node
        seen.add(name)
        results[name] = {"value": float(row["rel_err"])}
    if not results:
        return None
    t = float(loc.get("threshold") or max(r["value"] for r in results.values()))
    return {"results": results,
            "thresholds": [{"value": t / 10, "bgColor": GREEN}, {"value": t, "bgColor": YELLOW},
                           {"value": BEYOND, "bgColor": RED}]}


def command(model_path: str, overlay_path: str) -> str:
    """The command that opens the artifact with the overlay (Model Explorer's own CLI)."""
    return f"model-explorer {model_path} --node_data_paths {overlay_path}"
