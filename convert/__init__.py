"""tpu_pipeline.convert (installed from the repository folder `convert/`).

One PyTorch model -> LiteRT artifacts for android, ios, desktop, web and iot,
each checked on that target's runtime. Public API:

    convert(model_path, ConvertOptions(...), progress=None) -> report dict
    load_model, load_profiles, compare, judge, localize
"""

if __name__ != "tpu_pipeline.convert":
    # A top-level `convert` is another PyPI distribution; this folder is only ever
    # tpu_pipeline.convert (see pyproject's package-dir).
    raise ImportError("import tpu_pipeline.convert, not a top-level 'convert'")

_EXPORTS = {
    "convert": "pipeline", "ConvertOptions": "pipeline", "load_model": "loaders", "load_profiles": "targets",
    "TargetProfile": "targets", "compare": "parity", "judge": "parity", "localize": "parity",
}


def __getattr__(name):  # lazy: `tpu-pipeline --help` must not import torch or LiteRT
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(name)


__all__ = sorted(_EXPORTS)
