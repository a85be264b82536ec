"""Model classes named by `model.pt` manifests (`model_class`).

convert imports them by path without --trust-pickle because they live
inside tpu_pipeline; keep their constructors JSON-able keyword arguments.
"""
