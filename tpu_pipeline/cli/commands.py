"""The CLI's command registry: each `tpu_pipeline/cli/<name>.py` registers its click
command here where it defines it (`@register("name")` above `@click.command()`), and
`tpu_pipeline.cli` adds every registered command to the group."""

from __future__ import annotations

from typing import Callable

import click

from tpu_pipeline.registry import Registry

COMMANDS: Registry[click.Command] = Registry(
    "command", "a module tpu_pipeline/cli/<name>.py whose click command is decorated @register(\"<name>\")")

EXIT_CODES_HELP = (
    "Exit codes: 0 ok; 1 unexpected error (rerun with --debug); 2 bad input or "
    "not built yet; 3 conversion/compatibility failure; 4 parity failure; 5 training "
    "diverged (NaN/inf loss); 6 a distributed trainer failed while running (Ray, vLLM, a worker)."
)


def register(name: str) -> Callable[[click.Command], click.Command]:
    """Registers a click command under `name`; its description is the command's short help
    (a click.Command's own docstring is click's, not the command's)."""

    def add(cmd: click.Command) -> click.Command:
        COMMANDS.add(name, cmd, cmd.get_short_help_str(limit=120), defined_in=cmd.callback.__module__)
        return cmd

    return add
