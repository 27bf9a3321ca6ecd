"""One typed registry for every extension point: build engines, suite kinds, numerics formats.

Extension by registration (a new engine, suite kind or numerics format is one file and a
decorator) needs the same four behaviours everywhere, so they live here once: a collision is
an error, entries may be lazy (``name -> "module"`` imported on first use, so that naming an
engine does not import its heavy library), a lookup of an unknown name suggests the nearest
one, and the error names where the name came from.

A module imported lazily names its entry with ``mark("name")`` rather than calling the registry:
the registry imports the module, the module never imports the registry, so the two do not form a
circle (the layer test draws string imports too).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Generic, TypeVar

from quantgate.runtime.errors import ConfigFileError
from quantgate.runtime.suggest import did_you_mean

T = TypeVar("T")
MARK = "__quantgate_registered_as__"


def mark(name: str) -> Callable[[T], T]:
    """Decorator: ``entry`` is what the name ``name`` stands for, in a module a registry imports by
    name (``Registry.get`` finds it there). The module needs no registry to say so."""

    def decorate(entry: T) -> T:
        setattr(entry, MARK, name)
        return entry

    return decorate


class Registry(Generic[T]):
    """Named entries of one extension point (``what``), eager or lazy, collisions refused."""

    def __init__(self, what: str, lazy: dict[str, str] | None = None, how_to_add: str = "") -> None:
        self.what = what
        self.how_to_add = how_to_add
        self._entries: dict[str, T] = {}
        self._lazy = dict(lazy or {})

    def add(self, name: str, entry: T) -> None:
        """Register ``entry`` as ``name``; a different entry under a taken name is a ValueError."""
        if name in self._entries and self._entries[name] is not entry:
            raise ValueError(f"{self.what} {name!r} is already registered")
        self._entries[name] = entry

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of ``add``, for classes and functions that are the entry itself."""

        def decorate(entry: T) -> T:
            self.add(name, entry)
            return entry

        return decorate

    def names(self) -> list[str]:
        """Every registered name, lazy ones included, sorted."""
        return sorted({*self._entries, *self._lazy})

    def get(self, name: str, where: object = None) -> T:
        """The entry ``name`` (importing its module if lazy); unknown: ConfigFileError at ``where``."""
        if name not in self._entries and name in self._lazy:
            module = importlib.import_module(self._lazy[name])
            for entry in list(vars(module).values()):  # the entry ``mark(name)`` names, defined there
                own = getattr(entry, "__dict__", {})
                if own.get(MARK) == name and getattr(entry, "__module__", None) == module.__name__:
                    self.add(name, entry)
        if name not in self._entries:
            raise ConfigFileError(
                None if where is None else str(where),
                f"unknown {self.what} '{name}'",
                did_you_mean(name, self.names())
                + (f"; or register a new one with {self.how_to_add}" if self.how_to_add else ""),
            )
        return self._entries[name]
