"""The CLI through click's CliRunner and through the installed console script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import click
from click.testing import CliRunner

from tpu_pipeline.cli import PipelineGroup, cli
from tpu_pipeline.cli.commands import COMMANDS


def invoke(*args):
    return CliRunner().invoke(cli, list(args))


def test_help_lists_commands_and_exit_codes():
    r = invoke("--help")
    assert r.exit_code == 0
    for name in ("train", "rl", "convert", "doctor", "recipes", "--version"):
        assert name in r.output
    assert "4 parity failure" in r.output


def test_version():
    from tpu_pipeline import __version__

    r = invoke("--version")
    assert r.exit_code == 0 and __version__ in r.output


def test_doctor_json_names_the_device():
    r = invoke("doctor", "--json", "--device", "cpu")
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    assert report["device"]["kind"] == "cpu"
    assert report["device"]["device"] == "cpu"
    assert report["pallas"]["mode"] == "interpret"
    assert report["versions"]["torch"].startswith("2.")
    assert report["verdict"].startswith("ok")
    # measured and reported; how long depends on the box (a warm in-process run can take under a
    # millisecond), so only its type and sign are checked
    assert isinstance(report["seconds"], float) and report["seconds"] >= 0


def test_bad_device_is_one_line_exit_2():
    r = invoke("doctor", "--device", "quantum")
    assert r.exit_code == 2
    assert r.output.strip() == "Error: unknown device 'quantum'; valid: auto, tpu, cuda, cpu"
    assert "Traceback" not in r.output


def test_debug_shows_the_exception():
    r = invoke("--debug", "doctor", "--device", "quantum")
    assert r.exit_code != 0 and r.exception is not None


def test_unknown_command_exit_2():
    r = invoke("frobnicate")
    assert r.exit_code == 2
    assert "No such command 'frobnicate'" in r.output


def test_every_command_module_registers_its_command_where_it_is_defined():
    modules = sorted(p.stem for p in Path(cli.callback.__code__.co_filename).parent.glob("*.py")
                     if p.stem not in ("__init__", "commands", "quiet"))  # quiet: the entry point's stderr filter
    assert COMMANDS.names() == modules == sorted(cli.commands)
    for e in COMMANDS.entries():
        assert e.defined_in == f"tpu_pipeline.cli.{e.name}" and e.obj is cli.commands[e.name]
        assert e.description and "..." not in e.description  # a short help, not a truncated docstring
    section = invoke("--help").output.split("Commands:\n")[1].split("\n\n")[0]
    help_rows = [ln.split()[0] for ln in section.splitlines()]
    assert help_rows == modules


def test_unexpected_error_is_one_line_without_debug():
    @click.command()
    def boom():
        raise RuntimeError("disk on fire\nsecond line")

    group = PipelineGroup(commands={})
    group.add_command(boom, "boom")
    r = CliRunner().invoke(group, ["boom"])
    assert r.exit_code == 1
    assert r.output.strip() == "Error: unexpected RuntimeError: disk on fire (rerun with --debug for the traceback)"


def _console_script() -> str:
    script = Path(sys.executable).parent / "tpu-pipeline"
    return str(script) if script.exists() else shutil.which("tpu-pipeline")


def test_console_script_in_subprocess(tmp_path):
    env = {**os.environ, "TPU_PIPELINE_IGNORE_TPU_HARDWARE": "1"}
    out = subprocess.run([_console_script(), "doctor", "--json"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["device"]["kind"] == "cpu"
    bad = subprocess.run([_console_script(), "doctor", "--device", "nope"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr and bad.stderr.strip().count("\n") == 0


def test_debug_shows_the_tools_own_debug_lines(tmp_path):
    # what the page server and the child processes log at debug level (a dropped connection) shows
    # with --debug only; a normal run stays quiet
    code = ("import logging, sys\nfrom tpu_pipeline.cli import main\ntry:\n    main(sys.argv[1:])\n"
            "except SystemExit:\n    pass\n"
            "logging.getLogger('tpu_pipeline.convert.runtimes.browser').debug('page server: probe')\n")
    runs = {flag: subprocess.run([sys.executable, "-c", code, *flag, "--version"], cwd=tmp_path, capture_output=True,
                                 text=True, timeout=120) for flag in ((), ("--debug",))}
    assert "DEBUG tpu_pipeline.convert.runtimes.browser: page server: probe" in runs[("--debug",)].stderr
    assert "probe" not in runs[()].stderr and all(r.returncode == 0 for r in runs.values())
