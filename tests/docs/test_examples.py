"""Every shell and Python block in README.md and docs/ runs here, or says why it cannot.

A block runs unless the line before its fence is `<!-- not-run: REASON -->` (a TPU, a GPU,
minutes of training, a VeRL launch). A runnable block runs alone in an empty temporary folder,
with this venv's `tpu-pipeline` and `python` first on PATH; it passes when it exits 0 within
its time limit. So an example that stops working fails `make test` instead of misleading a
reader.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHELL = {"bash", "sh", "shell", "console"}
PYTHON = {"python", "py"}
MARKER = re.compile(r"^<!--\s*not-run:\s*(?P<reason>.*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})(?P<lang>[\w+-]*)")
TIME_LIMIT_S = 120  # the slowest runnable block (doctor) takes ~10 s on a quiet core


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository root
    line: int  # the fence's line, 1-based
    lang: str
    code: str
    not_run: str | None  # the reason, when marked

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def parse(path: Path) -> tuple[list[Block], list[str]]:
    """Fenced blocks of a Markdown file, and the problems of its not-run markers."""
    rel = path.relative_to(ROOT).as_posix()
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    i = 0
    pending: tuple[int, str] | None = None  # a marker waiting for its fence
    while i < len(lines):
        marker = MARKER.match(lines[i])
        if marker:
            if pending:
                problems.append(f"{rel}:{pending[0] + 1}: not-run marker followed by no code block")
            pending = (i, marker["reason"])
            i += 1
            continue
        fence = FENCE.match(lines[i])
        if fence:
            end = i + 1
            while end < len(lines) and not lines[end].startswith(fence["fence"]):
                end += 1
            reason = pending[1] if pending and pending[0] == i - 1 else None
            if pending and reason is None:
                problems.append(f"{rel}:{pending[0] + 1}: not-run marker must be the line right before a fence")
            if reason is not None and not reason:
                problems.append(f"{rel}:{i}: not-run marker without a reason")
            blocks.append(Block(rel, i + 1, fence["lang"].lower(), "\n".join(lines[i + 1:end]) + "\n", reason))
            pending = None
            i = end + 1
            continue
        i += 1
    if pending:
        problems.append(f"{rel}:{pending[0] + 1}: not-run marker followed by no code block")
    return blocks, problems


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def all_blocks() -> list[Block]:
    return [b for p in pages() for b in parse(p)[0]]


def runnable() -> list[Block]:
    return [b for b in all_blocks() if (b.lang in SHELL | PYTHON) and b.not_run is None]


def test_every_marker_names_a_reason_and_sits_on_a_block():
    problems = [msg for p in pages() for msg in parse(p)[1]]
    assert not problems, "\n".join(problems)


def test_pages_hold_both_kinds_of_blocks():
    # a parser that found nothing would pass every other test here
    blocks = all_blocks()
    assert any(b.not_run for b in blocks) and len(runnable()) >= 4, [b.id for b in blocks]
    assert any(b.lang in PYTHON for b in runnable()) and any(b.lang in SHELL for b in runnable())


def test_parser_reads_markers_and_fences(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    page = tmp_path / "p.md"
    page.write_text(
        "<!-- not-run: needs a TPU -->\n```bash\ntpu-pipeline train\n```\n\n"
        "```python\nprint(1)\n```\n<!-- not-run: -->\n```sh\nx\n```\n<!-- not-run: stray -->\ntext\n"
    )
    blocks, problems = parse(page)
    assert [(b.lang, b.not_run) for b in blocks] == [("bash", "needs a TPU"), ("python", None), ("sh", "")]
    assert len(problems) == 2 and "without a reason" in problems[0] and "no code block" in problems[1]


def run_block(block: Block, cwd: Path) -> subprocess.CompletedProcess:
    bin_dir = str(Path(sys.executable).parent)  # this venv: its tpu-pipeline and python
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    if block.lang in PYTHON:
        cmd = [sys.executable, "-c", block.code]
    else:
        cmd = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIME_LIMIT_S)


def test_a_broken_block_fails(tmp_path):
    # the runner must not pass a block whose first command fails and whose last succeeds
    assert run_block(Block("x.md", 1, "bash", "false\ntrue\n", None), tmp_path).returncode != 0
    assert run_block(Block("x.md", 1, "python", "import tpu_pipeline.no_such_module\n", None), tmp_path).returncode != 0


@pytest.mark.slow
@pytest.mark.parametrize("block", runnable(), ids=lambda b: b.id)
def test_block_runs(block, tmp_path):
    done = run_block(block, tmp_path)
    assert done.returncode == 0, f"{block.id} exited {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


def test_readme_links_resolve():
    # mkdocs --strict checks the links inside docs/; README.md is outside the site, so its own
    # relative links (each page one click from the front door) are checked here.
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert len(local) >= 10, local
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, missing


def _cli_lines(path: Path) -> list[str]:
    """The `tpu-pipeline COMMAND ...` usage lines of a page's plain (untagged) blocks."""
    lines, cmd = [], None
    for block in parse(path)[0]:
        if block.lang:
            continue
        for line in block.code.splitlines():
            if line.startswith("tpu-pipeline "):
                cmd = line.split()[1]
                lines.append(line.split("#")[0])
            elif line.startswith(" ") and cmd and lines:  # a continuation of the command above
                lines[-1] += " " + line.split("#")[0].strip()
    return lines


@pytest.mark.parametrize("page", ["README.md", "docs/reference/cli.md"])
def test_cli_at_a_glance_names_every_command_and_only_real_options(page):
    # the usage lines are written by hand: this keeps them to what the CLI has
    from tpu_pipeline.cli import cli

    lines = _cli_lines(ROOT / page)
    named = {line.split()[1] for line in lines}
    assert named == set(cli.commands), f"{page}: commands {sorted(named)} vs the CLI's {sorted(cli.commands)}"
    for line in lines:
        command = cli.commands[line.split()[1]]
        known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
        used = {tok.split("=")[0] for tok in re.findall(r"--[\w-]+(?:/--[\w-]+)?", line) for tok in tok.split("/")}
        assert used <= known, f"{page}: `{line.split()[1]}` has no {sorted(used - known)}"
