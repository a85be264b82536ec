"""The one registration mechanism: name -> object, registered where the object is defined.

    TASKS: Registry[type[Task]] = Registry("train task")

    @TASKS.register("arith_lm")            # description: the class docstring's first line
    class ArithTask(Task):
        \"\"\"A tiny Llama answering arithmetic as `#### N`.\"\"\"

Every entry carries a one-line description (given, or the first line of the
object's docstring; none is refused), a duplicate name is refused at import
time, and an unknown name fails with the list of valid ones, so a typo on the
command line tells the user what exists. Every registry is listed in
`REGISTRIES`, which `tpu-pipeline recipes --registries` prints.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterator, TypeVar

from tpu_pipeline.errors import UserError

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    description: str   # one line
    defined_in: str    # the module that registered it, where a newcomer goes to read it


# Every registry made, in creation order: what `tpu-pipeline recipes --registries` lists.
REGISTRIES: list["Registry"] = []


class Registry(Generic[T]):
    def __init__(self, kind: str, how_to_add: str = "", *, listed: bool = True):
        """kind: what an entry is ("train task"), used in error messages.
        how_to_add: one line for the listing (where a new entry goes).
        listed: False for a registry built per call (profiles from --profile-dir)."""
        self.kind = kind
        self.how_to_add = how_to_add
        self._entries: dict[str, Entry[T]] = {}
        if listed:
            REGISTRIES.append(self)

    def register(self, name: str, description: str | None = None) -> Callable[[T], T]:
        """Decorator: `@reg.register("x")` on the class or function that is entry "x"."""

        def add(obj: T) -> T:
            self.add(name, obj, description, defined_in=getattr(obj, "__module__", None))
            return obj

        return add

    def add(self, name: str, obj: T, description: str | None = None, *, defined_in: str | None = None) -> T:
        """Registers `obj` (for entries that are data, not definitions: a target's TOML file)."""
        if not name or not isinstance(name, str):
            raise ValueError(f"{self.kind}: a name must be a non-empty string, got {name!r}")
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered (by {self._entries[name].defined_in})")
        line = _one_line(description if description is not None else inspect.getdoc(obj))
        if not line:
            raise ValueError(f"{self.kind} {name!r} needs a one-line description (an argument or a docstring)")
        where = defined_in or sys._getframe(1).f_globals.get("__name__", "?")  # the module calling add()
        self._entries[name] = Entry(name, obj, line, where)
        return obj

    def get(self, name: str) -> T:
        return self.entry(name).obj

    def entry(self, name: str) -> Entry[T]:
        try:
            return self._entries[name]
        except KeyError:
            valid = ", ".join(sorted(self._entries)) or "(none)"
            raise UserError(f"unknown {self.kind} {name!r}; valid: {valid}") from None

    def entries(self) -> list[Entry[T]]:
        """In registration order (targets: the order of their files' `order` field)."""
        return list(self._entries.values())

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: Any) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)


def _one_line(text: str | None) -> str:
    return (text or "").strip().split("\n\n")[0].replace("\n", " ").strip()


def listing() -> list[dict[str, Any]]:
    """Every registry made so far, with its entries: what `tpu-pipeline recipes --registries`
    prints. Registries fill as their stage's modules are imported; the caller imports them."""
    return [{"kind": r.kind, "how_to_add": r.how_to_add,
             "entries": [{"name": e.name, "description": e.description, "defined_in": e.defined_in}
                         for e in r.entries()]}
            for r in REGISTRIES]
