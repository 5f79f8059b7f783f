"""``Registry``: the one name -> implementation table behind every extension point.

Losses, advantages, aggregations, datasets, rewards, extractors and selectors each own one;
registering is a decorator, a second registration of a name is refused, and an unknown name
raises the component's error class, naming the spec field (when given) and the known names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from evoagent.errors import EvoagentError

F = TypeVar("F")


class Registry(Generic[F]):
    """Name -> function table whose unknown-name error lists the known names."""

    def __init__(self, kind: str, error: type[EvoagentError], field: str | None = None) -> None:
        self.kind = kind
        self.error = error
        self.field = field
        self.entries: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator: register ``fn`` under ``name``; a name is registered once."""

        def deco(fn: F) -> F:
            self.add(name, fn)
            return fn

        return deco

    def add(self, name: str, entry: F) -> None:
        """Register ``entry`` under ``name``; a taken name is refused, never silently replaced."""
        if name in self.entries:
            raise self.error(f"{self.kind} {name!r} is already registered")
        self.entries[name] = entry

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def get(self, name: str) -> F:
        try:
            return self.entries[name]
        except KeyError:
            where = f"{self.field}: " if self.field else ""
            raise self.error(
                f"{where}unknown {self.kind} {name!r}; known: {self.names()}"
            ) from None

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self.entries)

    def loading(self, load: Callable[[], Any]) -> Loaded[F]:
        """This registry, read through ``load`` (importing the built-in implementations, each
        of which registers itself) run before the first read: the view a module above the
        implementations hands out, so no implementation is imported by the module it registers
        with."""
        return Loaded(self, load)


class Loaded(Generic[F]):
    """A registry that imports its built-ins on the first read (``Registry.loading``)."""

    def __init__(self, registry: Registry[F], load: Callable[[], Any]) -> None:
        self.registry, self._load = registry, load

    def _loaded(self) -> Registry[F]:
        if self._load is not None:
            self._load()
            self._load = None
        return self.registry

    def __contains__(self, name: object) -> bool:
        return name in self._loaded()

    def get(self, name: str) -> F:
        return self._loaded().get(name)

    def names(self) -> list[str]:
        return self._loaded().names()
