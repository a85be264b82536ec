"""tpu_pipeline.convert (installed from the repository folder `convert/`).

One PyTorch model -> LiteRT artifacts for android, ios, desktop, web and iot,
each checked on that target's runtime. Public API:

    convert(model, sample_args=None, *, targets="all", out=None, calibration=None, **options)
        -> ConvertResult (per target: TargetResult)
    load_model, load_profiles, compare, judge, localize
    ModelKind (a new kind of model: see kinds.py), TargetResult

Layout: pipeline.py composes the steps; module/ and lm/ are the two model kinds
(kinds.py, what a kind implements); precision/ derives a target's variant,
verdict/ decides whether it ships, runtimes/ runs it where the target does;
iot/ and npu/ hold one target's own pieces each. Each sub-package's direction
is an import-linter contract in pyproject.toml.
"""

import importlib

from tpu_pipeline.library_noise import quieted

if __name__ != "tpu_pipeline.convert":
    # A top-level `convert` is another PyPI distribution; this folder is only ever
    # tpu_pipeline.convert (see pyproject's package-dir).
    raise ImportError("import tpu_pipeline.convert, not a top-level 'convert'")

_EXPORTS = {
    "convert": "pipeline", "ConvertOptions": "options", "load_model": "module.loaders", "load_profiles": "targets",
    "TargetProfile": "targets", "compare": "verdict.parity", "judge": "verdict.parity", "localize": "verdict.parity",
    "ModelKind": "kinds", "TargetResult": "result", "ConvertResult": "result",
}


def __getattr__(name):
    # start-up: lazy, so `tpu-pipeline generate` (the two LM runtimes: no torch) and --help stay fast
    if name in _EXPORTS:
        with quieted():  # importing litert-torch prints the libraries' chatter (tpu_pipeline/library_noise.py)
            return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(name)


__all__ = sorted(_EXPORTS)
