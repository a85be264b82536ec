"""Builders for the model files the convert tests feed in (all tiny, all local)."""

from __future__ import annotations

from pathlib import Path

import torch

from tpu_pipeline.testing import convert_models as test_models
from tpu_pipeline.testing import reference_models as R

RM = "tpu_pipeline.testing.reference_models"


def manifest(cls, path: Path, *, task="classification", dtype=None, **kwargs) -> Path:
    """A model.pt manifest of reference model `cls`, or of a test model (convert_models.py),
    which convert then needs `--model-class` for: it imports nothing outside tpu_pipeline unasked."""
    torch.manual_seed(0)
    module = RM if hasattr(R, cls) else test_models.MODULE
    m = getattr(R if module == RM else test_models, cls)(**kwargs).eval()
    state = m.state_dict()
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    torch.save({"format": "tpu-pipeline/model@1", "model_class": f"{module}:{cls}", "model_kwargs": kwargs,
                "state_dict": state, "example_inputs": list(m.example_inputs()),
                "input_names": ["x"], "output_names": ["logits"], "task": task, "recipe": "test", "metrics": {}},
               path)
    return path


def hf_llama(path: Path, kv_heads: int = 2) -> Path:
    import transformers

    torch.manual_seed(0)
    # kv_heads=1: litert-torch 0.10 mis-converts a repeated one-head kv cache in HF's attention (a RESHAPE
    # where the transpose belongs; docs/DESIGN.md). initializer_range 0.5 makes attention far from
    # uniform, so a wrong graph shows.
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=kv_heads, max_position_embeddings=32,
                                   initializer_range=0.5)
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    return path


class Touch:
    """Creates a file when unpickled: the malicious pickle the loader must refuse."""

    def __init__(self, target: str):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def tiny_cnn_tflite(path: Path, channels: int = 4, classes: int = 5) -> tuple[torch.nn.Module, Path]:
    """A conv + linear classifier on 1x8x8 inputs, exported to a float .tflite at `path`."""
    import litert_torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, channels, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(channels * 6 * 6, classes)).eval()
    litert_torch.convert(model, (torch.randn(1, 1, 8, 8),)).export(str(path))
    return model, path
