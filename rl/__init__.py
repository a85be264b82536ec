"""tpu_pipeline.rl (installed from the repository folder `rl/`)."""

if __name__ != "tpu_pipeline.rl":
    # A top-level `rl` is another PyPI distribution; this folder is only ever
    # tpu_pipeline.rl (see pyproject's package-dir).
    raise ImportError("import tpu_pipeline.rl, not a top-level 'rl'")
