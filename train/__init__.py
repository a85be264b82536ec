"""tpu_pipeline.train (installed from the repository folder `train/`).

    from tpu_pipeline.train import run
    run("digits_cnn", "runs/digits")        # -> held-out figures, also in runs/digits/eval.json

Recipes are TOML files in train/recipes/; each names a task of
`tpu_pipeline.train.tasks` (one module per task: its problems, format and
verifier, shared with rl).
"""

if __name__ != "tpu_pipeline.train":
    # A top-level `train` is another PyPI distribution; this folder is only ever
    # tpu_pipeline.train (see pyproject's package-dir).
    raise ImportError("import tpu_pipeline.train, not a top-level 'train'")


def run(*args, **kwargs):
    """See `tpu_pipeline.train.runner.run`."""
    # CLI start-up time: runner imports torch, transformers and the kernels
    from tpu_pipeline.train.runner import run as _run

    return _run(*args, **kwargs)


__all__ = ["run"]
