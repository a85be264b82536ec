"""`model.pt`: the manifest convert reads with weights_only=True (docs/INTERFACES.md)."""

from __future__ import annotations

import importlib
import io
from pathlib import Path
from typing import Any, Sequence

import torch

from tpu_pipeline.files import atomic_write_bytes

FORMAT = "tpu-pipeline/model@1"


def write_model(path: Path, *, model_class: str, model_kwargs: dict, state_dict: dict,
                example_inputs: Sequence[torch.Tensor], input_names: Sequence[str],
                output_names: Sequence[str], task: str, recipe: str, metrics: dict[str, Any],
                calibration_inputs: Sequence[torch.Tensor] | None = None,
                output_kinds: dict[str, str] | None = None,
                shape_buckets: dict[str, Sequence[str]] | None = None,
                app_io: dict[str, Any] | None = None) -> None:
    """Writes the manifest atomically; tensors stay as trained (dtype and device).

    calibration_inputs: real inputs from the training data, one tensor per
    forward() argument, (N, *example.shape[1:]): what static-int8 calibration
    and parity should use instead of random inputs (digits pixels are 0..16,
    far from a random normal).
    output_kinds: output name -> what it is (logits, probabilities, regression, embedding,
    dense_map, token_logits; tpu_pipeline.convert.verdict.output_kinds), which decides how convert
    judges each artifact's output; an output left out is inferred from the graph or unknown.
    shape_buckets: inputs of several shapes, as convert's flags take them: {"shapes":
    ["x=1x16000,1x32000"]} or {"dynamic": ["x:1=16000..64000"]}, with "pad": ["x=length:len"]
    (docs/convert/shapes.md); convert then makes a signature per bucket unless its flags say otherwise.
    app_io: what an app hands the model, as convert's flags take it: {"image": "x:mean=127.5:std=127.5",
    "labels": [...], "metadata": {"author": ...}} (docs/convert/apps.md); convert then makes the artifacts
    MediaPipe-ready and checks them through MediaPipe Tasks.
    """
    if not model_class.startswith("tpu_pipeline."):
        raise ValueError(f"model_class must live inside tpu_pipeline, got {model_class!r}")
    obj = {
        "format": FORMAT,
        "model_class": model_class,
        "model_kwargs": dict(model_kwargs),
        "state_dict": {k: v.detach() for k, v in state_dict.items()},
        "example_inputs": [t.detach().cpu() for t in example_inputs],
        "input_names": list(input_names),
        "output_names": list(output_names),
        "task": task,
        "recipe": recipe,
        "metrics": dict(metrics),
    }
    if shape_buckets:
        obj["shape_buckets"] = {str(k): [str(x) for x in v] for k, v in shape_buckets.items()}
    if app_io:
        obj["app_io"] = {str(k): v for k, v in app_io.items()}
    if output_kinds:
        obj["output_kinds"] = {str(k): str(v) for k, v in output_kinds.items()}
    if calibration_inputs is not None:
        for t, ex in zip(calibration_inputs, example_inputs):
            if tuple(t.shape[1:]) != tuple(ex.shape[1:]) or t.dtype != ex.dtype:
                raise ValueError(f"calibration input {tuple(t.shape)} {t.dtype} does not match example {tuple(ex.shape)} {ex.dtype}")
        obj["calibration_inputs"] = [t.detach().cpu() for t in calibration_inputs]
    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(path, buf.getvalue())


def load_model(path: Path, map_location: str = "cpu") -> torch.nn.Module:
    """Rebuilds the model a manifest describes (what convert does), in eval mode."""
    m = torch.load(path, map_location=map_location, weights_only=True)
    if m.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} manifest")
    module, _, cls = m["model_class"].partition(":")
    model = getattr(importlib.import_module(module), cls)(**m["model_kwargs"])
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in m["state_dict"].items()})
    return model.eval()
