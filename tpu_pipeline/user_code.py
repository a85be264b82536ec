"""A user's own function named as `module:function` (an rl reward, a convert metric): imported,
never exec'd from a file. The module is looked up on sys.path, then in the current folder (as
`python -m` would find it: the `tpu-pipeline` console script's sys.path starts at its own bin
folder, not where the user typed the command)."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable

from tpu_pipeline.errors import UserError


def load_function(spec: str, flag: str) -> Callable[..., Any]:
    """`module:function` -> the function; UserError (one line naming `flag`) when the spec is
    malformed, the module cannot be imported or it has no such callable."""
    mod_name, sep, fn_name = spec.partition(":")
    if not sep or not mod_name or not fn_name:
        raise UserError(f"{flag} {spec!r}: expected module:function (e.g. my_metrics:accuracy)")
    try:
        mod = _import(mod_name)
    except Exception as e:  # noqa: BLE001 - a module that fails while importing is the user's code: one line
        raise UserError(f"{flag} {spec!r}: cannot import {mod_name!r} ({type(e).__name__}: {e})") from None
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise UserError(f"{flag} {spec!r}: {mod_name} has no function {fn_name!r}")
    return fn


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name.split(".")[0] or os.getcwd() in sys.path:
            raise
    sys.path.append(os.getcwd())  # after everything installed: a local file never shadows a library
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(os.getcwd())
