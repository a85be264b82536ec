"""The tool's own progress lines in the Python API, through `logging` as libraries do.

`convert(..., progress=None)` (the default) logs a line a step at INFO on the `tpu_pipeline.*`
loggers. With no logging set up by the user, the `tpu_pipeline` logger gets one handler that
prints those lines to stderr (as Transformers does for its own logger), so a script or notebook
shows them; `progress=False` or `logging.getLogger("tpu_pipeline").setLevel(logging.WARNING)`
silences them; an application that configures logging gets them through its own handlers.
`progress=callable` receives each line instead (the CLI prints them its own way).
"""

from __future__ import annotations

import logging
from typing import Callable

from tpu_pipeline.library_noise import debug_wanted

Reporter = Callable[[str], None]
ROOT_LOGGER = "tpu_pipeline"


def reporter(progress: bool | Reporter | None, logger: str) -> Reporter:
    """What a library function calls with each progress line (see the module's docstring)."""
    if callable(progress):
        return progress
    if progress is False:
        return lambda _line: None
    _default_handler()
    return logging.getLogger(logger).info


def _default_handler() -> None:
    root = logging.getLogger(ROOT_LOGGER)
    if root.level == logging.NOTSET:
        root.setLevel(logging.DEBUG if debug_wanted() else logging.INFO)
    if not root.hasHandlers():  # the user set up no logging: show the lines as the CLI does
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("  %(message)s"))
        root.addHandler(handler)
        # and only there: a library that sets up the root logger later (one of the converters does)
        # would print every line twice
        root.propagate = False
