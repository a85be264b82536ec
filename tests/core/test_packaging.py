"""The stage folders install only as tpu_pipeline.<stage>: never as top-level
`train`, `rl`, `convert` or `kernels` (other PyPI names; a top-level
`kernels` would make transformers believe Hugging Face's kernels is there)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("train", "rl", "convert", "kernels")

CHECK = """
import importlib, sys
for s in {stages!r}:
    importlib.import_module("tpu_pipeline." + s)
    try:
        importlib.import_module(s)
    except ImportError:
        pass
    else:
        sys.exit("top-level %s importable" % s)
print("ok")
"""
TRANSFORMERS_CHECK = """
from transformers.utils import is_kernels_available
assert not is_kernels_available(), "transformers sees a 'kernels' package"
"""


@pytest.mark.parametrize("cwd", ["elsewhere", "repo_root"])
def test_installed_copy_has_no_top_level_stage_modules(cwd, tmp_path):
    where = tmp_path if cwd == "elsewhere" else ROOT
    # From the repo root `python -c` puts the source folders on sys.path; there
    # the folders refuse a top-level import (tested below) instead.
    code = CHECK.format(stages=STAGES) if cwd == "elsewhere" else "import tpu_pipeline.kernels, tpu_pipeline.train\nprint('ok')"
    if cwd == "elsewhere":
        code = TRANSFORMERS_CHECK + code
    out = subprocess.run([sys.executable, "-c", code], cwd=where,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")


def test_wheel_contains_only_tpu_pipeline(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("tpu_pipeline-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"tpu_pipeline"}
    # Every package folder in the tree must ship (pyproject lists them by hand).
    for src, dest in [("tpu_pipeline", "tpu_pipeline")] + [(s, f"tpu_pipeline/{s}") for s in STAGES]:
        for init in (ROOT / src).rglob("__init__.py"):
            rel = init.relative_to(ROOT / src).as_posix()
            assert f"{dest}/{rel}" in names, f"{src}/{rel} missing from the wheel: add it to pyproject packages"
    for toml in [*ROOT.glob("*/recipes/*.toml"), *ROOT.glob("*/targets/*.toml")]:
        stage = toml.parent.parent.name
        assert f"tpu_pipeline/{stage}/{toml.parent.name}/{toml.name}" in names
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "tpu-pipeline = tpu_pipeline.cli:main" in entry_points


def test_wheel_install_in_fresh_venv_imports_from_elsewhere(tmp_path):
    """A plain (non-editable) install, checked from another folder."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "w"), str(ROOT)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "w").glob("tpu_pipeline-*.whl")
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    code = f"import sys; sys.path.insert(0, {str(target)!r}); import tpu_pipeline; print(tpu_pipeline.__file__)\n"
    code += CHECK.format(stages=STAGES)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[0].startswith(str(target))


def test_top_level_import_from_repo_root_is_refused():
    out = subprocess.run([sys.executable, "-c", "import kernels"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0
    assert "import tpu_pipeline.kernels, not a top-level 'kernels'" in out.stderr
