"""Errors that reach the user as one line and a documented exit code.

Library code raises these; the CLI turns them into `Error: <message>` and
exits with `exit_code`. Anything else is a bug and shows a traceback only
with `--debug` (or TPU_PIPELINE_DEBUG=1).
"""

from __future__ import annotations

# Exit codes shared by every command (documented in README and --help).
EXIT_OK = 0
EXIT_FAILURE = 1        # unexpected error (a bug): rerun with --debug
EXIT_BAD_INPUT = 2      # bad arguments, files or config; also "not built yet"
EXIT_CONVERSION = 3     # conversion or target compatibility failed
EXIT_PARITY = 4         # an artifact converted but did not match PyTorch
EXIT_DIVERGED = 5       # training or RL produced NaN/inf: the run, not the input, went wrong
EXIT_TRAINER = 6        # a distributed trainer failed at run time (Ray, vLLM, a worker): the run, not the input


class PipelineError(Exception):
    """Base class: a failure the user can act on."""

    exit_code = EXIT_FAILURE


class UserError(PipelineError, ValueError):
    """Bad input: an argument, file, config value or request that cannot work."""

    exit_code = EXIT_BAD_INPUT


class NotBuiltError(UserError):
    """A capability that this version does not provide yet."""


class ConversionError(PipelineError):
    exit_code = EXIT_CONVERSION


class ParityError(PipelineError):
    exit_code = EXIT_PARITY


class DivergedError(PipelineError):
    """A run whose loss or gradients became NaN/inf.

    Not bad input: the same command may work with a lower learning rate or
    another seed. The last good checkpoint is kept.
    """

    exit_code = EXIT_DIVERGED


class TrainerError(PipelineError):
    """A distributed trainer (VeRL on Ray) failed while running: Ray could not start, vLLM
    could not load the policy, a worker died. The last good checkpoint is kept."""

    exit_code = EXIT_TRAINER
