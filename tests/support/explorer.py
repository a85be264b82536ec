"""What Model Explorer draws for a .tflite, read with its own TFLite adapter: the tests check the
per-layer error overlays convert writes (convert/verdict/layer_errors.py) against it."""

from __future__ import annotations

import json
from pathlib import Path

import ai_edge_model_explorer_adapter as adapter  # the C++ adapter `model-explorer` runs on a .tflite

NOT_OPS = ("GraphInputs", "GraphOutputs", "pseudo_const")


def explorer_nodes(tflite: Path) -> dict[str, str]:
    """tensor_name -> op label, for every op node of every graph Model Explorer draws."""
    graphs = json.loads(adapter.ConvertFlatbufferDirectlyToJson(adapter.VisualizeConfig(), str(tflite)))
    nodes = {}
    for sub in graphs[0]["subgraphs"]:
        for node in sub["nodes"]:
            if node["label"] in NOT_OPS:
                continue
            for out in node["outputsMetadata"]:
                attrs = {a["key"]: a["value"] for a in out["attrs"]}
                if "tensor_name" in attrs:
                    nodes[attrs["tensor_name"]] = node["label"]
    return nodes
