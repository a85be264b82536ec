"""mkdocs hook: a source tree whose folders match the import paths, for the API pages.

The repository's folders are not the import paths (pyproject's package-dir installs
`convert/` as `tpu_pipeline.convert`, and so on), so mkdocstrings, which reads the source
without importing it, cannot find `tpu_pipeline.convert`. Importing instead would run
`tpu_pipeline.__main__` (the CLI) and pull in torch. This hook copies the .py files into
build/api_src/ the way the package-dir mapping installs them (copies: griffe resolves
symlinks back to the repository folders and names the modules after those); mkdocs.yml
points mkdocstrings there.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

from mkdocs.plugins import event_priority

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "api_src"


@event_priority(100)  # before mkdocstrings' own on_config, which drops search paths that do not exist yet
def on_config(config, **kwargs):
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    shutil.rmtree(OUT, ignore_errors=True)
    for name, folder in mapping.items():
        src = ROOT / folder
        dest = OUT.joinpath(*name.split("."))
        for py in src.rglob("*.py"):
            rel = py.relative_to(src)
            if "__pycache__" in rel.parts:
                continue
            out = dest / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(py, out)
    return config
