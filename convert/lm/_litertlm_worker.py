"""Exports a Hugging Face causal-LM folder to a .litertlm bundle with litert-torch's
`export_hf`, in a child process (litertlm.export_bundle runs it).

A child process because export_hf imports every model extension litert-torch
ships and patches transformers classes for tracing; the parent's PyTorch
reference model must stay the unpatched one parity compares against.

No TensorFlow: litert-torch 0.10 imports `tensorflow.lite.python.schema_py_generated`
at import time in exactly one extension (bonsai_flux2, an image-generation model
this path never uses). That module is the TFLite flatbuffer schema, which
ai_edge_litert ships as `ai_edge_litert.schema_py_generated` (the same generated
code, with newer types added). It is aliased under the TensorFlow name only while
that one extension is imported, after everything else that probes for TensorFlow
has been imported, and removed again before the export runs.

One API gap is filled here too: litert-torch 0.10's LiteRTLMCache calls
`Cache.get_max_length()` for sliding-window layers (Mistral's sliding_window,
Gemma 2/3), which transformers 5.10 (the newest verl 0.9.1 allows) no longer
has; the export failed with AttributeError. Its own cache layers have the
method, so the cache answers with the longest of its layers, only when the
method is missing.

Sampler defaults: the bundle's LLM metadata carries the folder's own sampling
(generation_config.json with do_sample, which export_hf reads itself); a folder
that does not sample gets greedy (top_k 1), the decoding parity verifies.
Apps read them from the bundle (the app snippets spell them out).

Usage: python _litertlm_worker.py HF_DIR OUT_DIR CACHE_LENGTH PREFILL_LENGTH
Writes OUT_DIR/model.litertlm (float32 weights; variants are derived by the parent).
"""

import importlib.util
import json
import sys
import types
from pathlib import Path

# Everything that asks "is TensorFlow installed?" at import time is imported before the alias exists.
import ai_edge_quantizer.quantizer  # noqa: F401
import litert_torch  # noqa: F401
import torch._dynamo  # noqa: F401
import transformers  # noqa: F401
from ai_edge_litert import schema_py_generated
from litert_torch.generative.export_hf.core.image_gen import image_gen_model  # noqa: F401
from litert_torch.generative.export_hf.model_ext.bonsai_flux2 import modeling_flux2  # noqa: F401

_TF_PACKAGES = ("tensorflow", "tensorflow.lite", "tensorflow.lite.python")
_TF_SCHEMA = "tensorflow.lite.python.schema_py_generated"


def import_export_hf():
    if importlib.util.find_spec("tensorflow") is None:
        for name in _TF_PACKAGES:
            package = types.ModuleType(name)
            package.__path__ = []
            sys.modules[name] = package
        sys.modules[_TF_SCHEMA] = schema_py_generated
        try:
            from litert_torch.generative.export_hf.model_ext.bonsai_flux2 import bonsai_flux2  # noqa: F401
        finally:
            for name in (*_TF_PACKAGES, _TF_SCHEMA):
                del sys.modules[name]
    from litert_torch.generative.export_hf import export
    from litert_torch.generative.export_hf.core import cache_base

    if not hasattr(cache_base.LiteRTLMCacheMixin, "get_max_length"):
        cache_base.LiteRTLMCacheMixin.get_max_length = lambda self: max(
            layer.get_max_length() for layer in self.layers)
    return export


GREEDY = {"sampler_top_k": 1, "sampler_top_p": 1.0, "sampler_temperature": 1.0}


def sampler_args(hf_dir: str) -> dict:
    """export_hf's sampler arguments: none when the folder's generation_config.json samples
    (export_hf takes its top_k/top_p/temperature), else greedy."""
    path = Path(hf_dir) / "generation_config.json"
    gen = json.loads(path.read_text()) if path.is_file() else {}
    return {} if gen.get("do_sample") else GREEDY


def main(hf_dir: str, out_dir: str, cache_length: str, prefill_length: str) -> None:
    export = import_export_hf()
    export.export(model=hf_dir, output_dir=out_dir, prefill_lengths=[int(prefill_length)],
                  cache_length=int(cache_length), quantization_recipe="none", trust_remote_code=False,
                  **sampler_args(hf_dir))


if __name__ == "__main__":
    main(*sys.argv[1:5])
