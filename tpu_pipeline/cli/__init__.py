"""`tpu-pipeline` command line: a thin layer over the library.

Each command lives in its own module (imported only when that command runs,
so `--help` and `doctor` stay fast) and calls one library function.
Library errors (`PipelineError`) become one line and their exit code; a
traceback is shown only with `--debug` or TPU_PIPELINE_DEBUG=1.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from tpu_pipeline import __version__
from tpu_pipeline.errors import EXIT_FAILURE, PipelineError

EXIT_CODES_HELP = (
    "Exit codes: 0 ok; 1 unexpected error (rerun with --debug); 2 bad input or "
    "not built yet; 3 conversion/compatibility failure; 4 parity failure; 5 training "
    "diverged (NaN/inf loss)."
)

# command name -> (module under tpu_pipeline.cli, one-line help)
COMMANDS = {
    "train": ("train", "Train a model from a recipe."),
    "rl": ("rl", "Improve a policy with a GRPO recipe."),
    "eval": ("eval", "Evaluate a policy on fresh held-out problems."),
    "convert": ("convert", "Convert a PyTorch model to LiteRT artifacts for each target."),
    "generate": ("generate", "Generate text with an exported LiteRT language model."),
    "doctor": ("doctor", "Check the installation and the device this machine offers."),
    "recipes": ("recipes", "List the train and rl recipes."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return list(COMMANDS) + sorted(self.commands)

    def get_command(self, ctx, name):
        if name in self.commands:
            return self.commands[name]
        if name not in COMMANDS:
            return None
        module = importlib.import_module(f"{__name__}.{COMMANDS[name][0]}")
        return module.command

    def format_commands(self, ctx, formatter):
        # Help text without importing every command module.
        rows = [(name, help_) for name, (_, help_) in COMMANDS.items()]
        rows += [(name, cmd.get_short_help_str()) for name, cmd in sorted(self.commands.items())]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

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
        except KeyboardInterrupt:
            click.echo("Interrupted.", err=True)
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


@click.group(cls=LazyGroup, epilog=EXIT_CODES_HELP)
@click.version_option(__version__, "--version", prog_name="tpu-pipeline")
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
def cli(debug: bool) -> None:
    """Train PyTorch models on TPU/GPU/CPU, improve them with GRPO, ship them as LiteRT."""


def main(argv: list[str] | None = None) -> None:
    cli.main(args=argv if argv is not None else sys.argv[1:], prog_name="tpu-pipeline")


def not_built(name: str, issue: str):
    """A command whose capability is not built yet: says so and exits 2."""

    @click.command(name=name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
                   add_help_option=False)
    def command():
        click.echo(f"Error: `tpu-pipeline {name}` is not built yet ({issue}).", err=True)
        sys.exit(2)

    return command
