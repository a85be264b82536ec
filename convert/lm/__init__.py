"""The `causal-lm` model kind: a Hugging Face causal-LM folder.

kind.py (CausalLMKind), litertlm.py (the .litertlm bundle: export through
_litertlm_worker.py in a child process, variants, greedy parity on LiteRT-LM),
litertlm_runtime.py (LiteRT-LM's Engine, no PyTorch), decode_ready.py (this project's
prefill/decode export with an explicit KV cache) and decode_ready_runtime.py (its
reference client, no PyTorch), quant_recipes.py (LM quantization recipes and held-out
perplexity). Uses the shared pipeline modules of tpu_pipeline.convert; never imports
convert.module or convert.iot (pyproject's independence contract). Imports nothing at
package level, so `tpu-pipeline generate` loads only the two runtimes.
"""
