"""The model builders that live with the tests (tests/convert/zoo.py, lm_zoo.py), loaded by
path for the bench scripts: the tests are not an installed package."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def load(name: str):
    """tests/convert/<name>.py as a module (registered first: dataclasses look their module up
    while the file executes)."""
    spec = importlib.util.spec_from_file_location(f"tpu_pipeline_{name}", REPO / "tests" / "convert" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
