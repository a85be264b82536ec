"""`tpu_pipeline.testing`: what the tests and the bench scripts share (model builders,
the import-layer linter), installed from tests/support/ through pyproject's package-dir.

Importable from anywhere the package is installed (`from tpu_pipeline.testing import zoo`),
the way `torch.testing` is, so no test or benchmark loads another file by its path. It sits
above every other layer: it may build models for any stage, and nothing in the library
imports it.
"""
