"""tpu_pipeline.train (installed from the repository folder `train/`)."""

if __name__ != "tpu_pipeline.train":
    # A top-level `train` is another PyPI distribution; this folder is only ever
    # tpu_pipeline.train (see pyproject's package-dir).
    raise ImportError("import tpu_pipeline.train, not a top-level 'train'")
