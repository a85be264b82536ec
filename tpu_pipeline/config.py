"""One config system for recipes and target profiles: typed dataclasses
filled from TOML files that users can copy and edit.

Each stage declares keyword-only dataclasses; `load(cls, path)` reads the
file, checks every key and type, and applies `key.sub=value` overrides from
the command line. Unknown keys and wrong types are `UserError`s that name the
file and the key, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from tpu_pipeline.errors import UserError

T = TypeVar("T")


def load(cls: type[T], source: str | Path | dict, overrides: dict[str, Any] | None = None) -> T:
    """Builds `cls` from a TOML file (or a dict), then applies dotted overrides."""
    return build(cls, *read(source, overrides))


def read(source: str | Path | dict, overrides: dict[str, Any] | None = None) -> tuple[dict, str]:
    """The raw table of a TOML file (or a dict) with dotted overrides applied, and where it came from."""
    if isinstance(source, dict):
        data, where = dict(source), "config"
    else:
        path = Path(source)
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise UserError(f"config file not found: {path}") from None
        except tomllib.TOMLDecodeError as e:
            raise UserError(f"{path}: not valid TOML ({e})") from None
        where = str(path)
    for dotted, value in (overrides or {}).items():
        _set_dotted(data, dotted, value)
    return data, where


def build(cls: type[T], data: dict, where: str = "config") -> T:
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a table, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r}; valid keys: {', '.join(sorted(fields))}")
    kwargs = {name: _coerce(hints[name], value, f"{where}: {name}") for name, value in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as e:  # a required field is missing
        raise UserError(f"{where}: {e}") from None


def to_dict(obj: Any) -> dict:
    return dataclasses.asdict(obj)


def _set_dotted(data: dict, dotted: str, value: Any) -> None:
    """`data["a"]["b"] = value` for "a.b", making tables on the way (a --set override)."""
    keys = dotted.split(".")
    for key in keys[:-1]:
        data = data.setdefault(key, {})
        if not isinstance(data, dict):
            raise UserError(f"override {dotted!r}: {key!r} is not a table")
    data[keys[-1]] = value


def _coerce(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, where)
            except UserError as e:
                errors.append(str(e))
        raise UserError(errors[0] if errors else f"{where}: invalid value {value!r}")
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise UserError(f"{where}: {value!r} is not one of {', '.join(map(repr, allowed))}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise UserError(f"{where}: expected a list, got {value!r}")
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        items = [_coerce(item_tp, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{where}: expected a table, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, where)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise UserError(f"{where}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise UserError(f"{where}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise UserError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise UserError(f"{where}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise UserError(f"{where}: expected a string, got {value!r}")
    return value
