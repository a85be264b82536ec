"""tpu_pipeline.convert (installed from the repository folder `convert/`)."""

if __name__ != "tpu_pipeline.convert":
    # A top-level `convert` is another PyPI distribution; this folder is only ever
    # tpu_pipeline.convert (see pyproject's package-dir).
    raise ImportError("import tpu_pipeline.convert, not a top-level 'convert'")
