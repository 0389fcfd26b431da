"""A name -> object table whose errors list what is known (templates, multimodal plugins)."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")


class Registry:
    """Objects registered by name; :meth:`get` of an unknown name raises :attr:`error` listing the known
    names and the closest one. Subclasses may load more entries on a miss (:meth:`_on_miss`)."""

    #: Exception raised for an unknown or doubly registered name.
    error: type[KeyError] = KeyError

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, Any] = {}

    def register(self, name: str, obj: Any = None) -> Any:
        """Register ``obj`` under ``name`` (or use as a decorator); a different object under a taken name
        raises."""

        def decorate(item: T) -> T:
            existing = self._items.get(name)
            if existing is not None and existing is not item and _qualname(existing) != _qualname(item):
                raise self.error(
                    f"{self.kind} {name!r} is already registered to {_qualname(existing)}; cannot register "
                    f"{_qualname(item)} under the same name"
                )
            self._items[name] = item
            return item

        return decorate if obj is None else decorate(obj)

    def get(self, name: str) -> Any:
        """The object registered as ``name``."""
        if name in self:
            return self._items[name]
        known = sorted(self._items)
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise self.error(
            f"unknown {self.kind} {name!r}.{hint} Known {self.kind}s: {known or 'none'}.{self._miss_hint()}"
        )

    def __contains__(self, name: object) -> bool:
        if name not in self._items:
            self._on_miss()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        self._on_miss()
        return iter(sorted(self._items))

    def _on_miss(self) -> None:
        """Hook: load more registrations before a lookup fails (the base registry loads nothing)."""

    def _miss_hint(self) -> str:
        return ""


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
