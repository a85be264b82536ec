"""Run import-linter over the installed package layout.

The stage folders (train/ rl/ convert/ kernels/) sit at the repository root
and install as tpu_pipeline.* through pyproject's package-dir mapping, which
grimp cannot see from an editable install. This builds the installed layout
as a tree of symlinks and lints that, so the contracts in pyproject.toml
(`[tool.importlinter]`) apply to the code as users import it.

    python -m tpu_pipeline.testing.layers [REPO_ROOT]     # exit 0 = contracts kept (make lint)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path


def build_tree(repo: Path, dest: Path, *, copy: bool = False) -> Path:
    """dest/tpu_pipeline/... laid out as pyproject's package-dir installs it.

    Links by default; copy=True copies the Python files instead, for a tree
    that may be edited (a test planting a violation) without touching the repo.
    """
    mapping = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    # Deepest packages last, so a parent's folder exists before its children's links.
    for package, folder in sorted(mapping.items(), key=lambda kv: kv[0].count(".")):
        target = dest.joinpath(*package.split("."))
        if package.count(".") == 0:
            target.mkdir(parents=True)
            for entry in (repo / folder).iterdir():
                if entry.name not in mapping_leaves(mapping, package):
                    _place(entry, target / entry.name, copy)
        else:
            _place(repo / folder, target, copy)
    return dest


def _place(src: Path, dst: Path, copy: bool) -> None:
    if not copy:
        dst.symlink_to(src.resolve(), target_is_directory=src.is_dir())
    elif src.is_dir():
        shutil.copytree(src, dst, ignore=_not_python)
    elif src.suffix == ".py":
        shutil.copy2(src, dst)


def _not_python(folder: str, names: list[str]) -> set[str]:
    return {n for n in names if not n.endswith(".py") and not (Path(folder) / n).is_dir()} | {"node_modules"}


def mapping_leaves(mapping: dict, parent: str) -> set[str]:
    return {p.split(".")[-1] for p in mapping if p.startswith(parent + ".") and p.count(".") == parent.count(".") + 1}


def lint(tree: Path, config: Path, **run_kwargs) -> subprocess.CompletedProcess:
    """lint-imports with `config` over a tree made by build_tree."""
    linter = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([str(linter), str(config), "--no-cache", "--no-logo"], cwd=tree, env=env, **run_kwargs)


def main(argv: list[str]) -> int:
    # This file is tests/support/layers.py of the checkout (an editable install resolves to it).
    repo = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parents[2]).resolve()
    with tempfile.TemporaryDirectory(prefix="lint-tree-") as tmp:
        return lint(build_tree(repo, Path(tmp)), repo / "pyproject.toml").returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv))
