"""`tpu-pipeline` command line: a thin layer over the library.

Each command lives in its own module, `tpu_pipeline/cli/<name>.py`, registers
itself in `commands.COMMANDS` where it is defined, and calls one library
function; command modules import their library stage inside the command
(CLI start-up time), so importing every module here keeps `--help` fast.
Library errors (`PipelineError`) become one line and their exit code; a
traceback is shown only with `--debug` or TPU_PIPELINE_DEBUG=1.
"""

from __future__ import annotations

import importlib
import logging
import os
import pkgutil
import sys

import click

from tpu_pipeline import __version__
from tpu_pipeline.cli.commands import COMMANDS, EXIT_CODES_HELP
from tpu_pipeline.errors import EXIT_FAILURE, PipelineError
from tpu_pipeline.library_noise import quiet_process


class PipelineGroup(click.Group):
    """A click group whose errors are one line with the error's exit code."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except PipelineError as e:
            if debug_enabled(ctx):
                raise
            click.echo(f"Error: {e}", err=True)
            ctx.exit(e.exit_code)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM/SIGHUP during a VeRL launch (rl/verl_launch.py)
            click.echo(f"Interrupted by {e}." if str(e) else "Interrupted.", err=True)
            ctx.exit(130)
        except Exception as e:
            if debug_enabled(ctx):
                raise
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            click.echo(f"Error: unexpected {type(e).__name__}: {first} (rerun with --debug for the traceback)", err=True)
            ctx.exit(EXIT_FAILURE)


def debug_enabled(ctx: click.Context | None = None) -> bool:
    if os.environ.get("TPU_PIPELINE_DEBUG") == "1":
        return True
    root = ctx.find_root() if ctx else None
    return bool(root and root.params.get("debug"))


@click.group(cls=PipelineGroup, epilog=EXIT_CODES_HELP)
@click.version_option(__version__, "--version", prog_name="tpu-pipeline")
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors, the libraries' own warnings and the tool's debug log.")
def cli(debug: bool) -> None:
    """Train PyTorch models on TPU/GPU/CPU, improve them with GRPO, ship them as LiteRT."""


def main(argv: list[str] | None = None) -> None:
    args = argv if argv is not None else sys.argv[1:]
    if not (os.environ.get("TPU_PIPELINE_DEBUG") == "1" or "--debug" in args):
        quiet_process()  # the libraries' own chatter only with --debug (library_noise.py says which and why)
    else:
        os.environ["TPU_PIPELINE_DEBUG"] = "1"  # --debug: the library calls and child processes show everything too
        # and the tool's own debug lines: the page server's dropped connections, child processes
        logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
        logging.getLogger("tpu_pipeline").setLevel(logging.DEBUG)
    cli.main(args=args, prog_name="tpu-pipeline")


# Every module of this package but the registry is a command module: importing it registers it.
for _module in pkgutil.iter_modules(__path__):
    if _module.name != "commands":
        importlib.import_module(f"{__name__}.{_module.name}")
for _entry in COMMANDS.entries():
    cli.add_command(_entry.obj, _entry.name)
