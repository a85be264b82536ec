"""The import layers in pyproject.toml hold, and a planted violation breaks them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tpu_pipeline.testing import layers as lint_imports

ROOT = Path(__file__).resolve().parents[2]


def _lint(tree: Path) -> subprocess.CompletedProcess:
    return lint_imports.lint(tree, ROOT / "pyproject.toml", capture_output=True, text=True, timeout=300)


def _plant(tree: Path, module: str, line: str) -> None:
    """Append `line` to one module of a copied tree (never the repository's file)."""
    path = tree.joinpath(*module.split(".")).with_suffix(".py")
    if not path.exists():
        path = tree.joinpath(*module.split(".")) / "__init__.py"
    assert not any(p.is_symlink() for p in [path, *path.parents]), "plant only into a copied tree"
    path.write_text(path.read_text() + "\n" + line + "\n")


def test_the_layers_hold(tmp_path):
    out = _lint(lint_imports.build_tree(ROOT, tmp_path / "tree"))
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


@pytest.mark.parametrize("module,line,contract", [
    # core must not reach up into a stage
    ("tpu_pipeline.errors", "import tpu_pipeline.train", "cli > rl > train"),
    # convert stands on core only
    ("tpu_pipeline.convert.verdict.parity", "from tpu_pipeline.kernels import rms_norm", "cli > rl > train"),
    # train hands rl files, never the reverse
    ("tpu_pipeline.train.loop", "import tpu_pipeline.rl", "cli > rl > train"),
    ("tpu_pipeline.rl", "import tpu_pipeline.convert", "only the CLI uses convert"),
    # a model kind reaches into the iot target's pieces instead of asking quantize/runtimes
    ("tpu_pipeline.convert.module.loaders", "import tpu_pipeline.convert.iot.firmware", "convert's sub-packages"),
    # a runtime judging its own output (runtimes sit below verdict)
    ("tpu_pipeline.convert.runtimes.overlap", "import tpu_pipeline.convert.verdict.parity", "convert: pipeline > kinds"),
    # the shared meaning of an output reaching up into one judge
    ("tpu_pipeline.convert.verdict.output_kinds", "import tpu_pipeline.convert.verdict.parity", "convert.verdict"),
    # turn-taking reaching up into a runner
    ("tpu_pipeline.convert.runtimes.overlap", "import tpu_pipeline.convert.runtimes.browser", "convert.runtimes: runners"),
    # where the QNN libraries come from reaching up into the compile step
    ("tpu_pipeline.convert.npu.qnn_libs", "import tpu_pipeline.convert.npu.compile", "convert.npu"),
    # the per-bucket steps reaching up into the pipeline that calls them
    ("tpu_pipeline.convert.shapes", "import tpu_pipeline.convert.pipeline", "convert: pipeline > kinds"),
    # a flatbuffer rewrite calling back into quantize
    ("tpu_pipeline.convert.precision.tflm_int8", "import tpu_pipeline.convert.precision.quantize", "convert.precision"),
    # a task reaching up into train's machinery
    ("tpu_pipeline.train.tasks.arith", "import tpu_pipeline.train.runner", "train: worker > runner"),
    # a cycle inside one package
    ("tpu_pipeline.files", "import tpu_pipeline.config", "no import cycles"),
])
def test_a_planted_violation_fails(tmp_path, module, line, contract):
    tree = lint_imports.build_tree(ROOT, tmp_path / "tree", copy=True)
    if module == "tpu_pipeline.files":  # a two-module cycle needs both directions
        _plant(tree, "tpu_pipeline.config", "import tpu_pipeline.files")
    _plant(tree, module, line)
    out = _lint(tree)
    assert out.returncode != 0
    broken = [ln for ln in out.stdout.splitlines() if ln.endswith("BROKEN")]
    assert any(ln.startswith(contract) for ln in broken), out.stdout[-3000:]


def test_convert_top_level_stays_small():
    # convert/'s concerns live in sub-packages (docs/DESIGN.md "Layers"); a new step goes into one of them
    top = sorted(p.name for p in (ROOT / "convert").glob("*.py"))
    assert len(top) <= 12, top
