"""tpu_pipeline.kernels (installed from the repository folder `kernels/`)."""

if __name__ != "tpu_pipeline.kernels":
    # A top-level `kernels` is another PyPI distribution; this folder is only ever
    # tpu_pipeline.kernels (see pyproject's package-dir).
    raise ImportError("import tpu_pipeline.kernels, not a top-level 'kernels'")
