"""Name -> object registries for devices, targets, recipes and rewards.

Duplicate names fail at registration; an unknown name fails with the list of
valid ones, so a typo on the command line tells the user what exists.
"""

from __future__ import annotations

from typing import Generic, Iterator, TypeVar

from tpu_pipeline.errors import UserError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, item: T | None = None):
        """`reg.register("x", obj)` or as a decorator `@reg.register("x")`."""

        def add(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        if item is not None:
            return add(item)
        return add

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            valid = ", ".join(sorted(self._items)) or "(none)"
            raise UserError(f"unknown {self.kind} {name!r}; valid: {valid}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)

