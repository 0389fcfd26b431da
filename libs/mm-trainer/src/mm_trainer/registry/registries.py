"""Registries that plugins fill: model classes (sub-models and containers), datasets and rewards.

A plugin module registers its pieces at import time::

    @model_register("wan2_2_predictor")
    class WanPredictor(BaseModel, nn.Module): ...

The trainer then looks them up by the ids named in the YAML; an id nobody registered yet makes
the registry import the installed ``mm_trainer.plugins`` entry points once and look again.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from mm_trainer.registry.plugins import load_entry_point_plugins

T = TypeVar("T")


class RegistryError(KeyError):
    """An id is missing from, or registered twice in, a registry."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly
        return str(self.args[0])


class Registry:
    """A name -> object table with errors that list what is known."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, Any] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator registering ``obj`` under ``name``; a different object under a taken name raises."""

        def decorate(obj: T) -> T:
            existing = self._items.get(name)
            if existing is not None and existing is not obj and _qualname(existing) != _qualname(obj):
                raise RegistryError(
                    f"{self.kind} id {name!r} is already registered to {_qualname(existing)}; "
                    f"cannot register {_qualname(obj)} under the same id"
                )
            self._items[name] = obj
            return obj

        return decorate

    def get(self, name: str) -> Any:
        """Return the object registered as ``name`` or raise listing the known ids.

        A miss first imports the installed ``mm_trainer.plugins`` entry points (once).
        """
        if name in self:  # a miss loads the entry points first
            return self._items[name]
        known = sorted(self._items)
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise RegistryError(
            f"unknown {self.kind} id {name!r}.{hint} Known {self.kind} ids: {known or 'none'}. "
            "Is the plugin that registers it listed in `training.plugin` or installed with an "
            "`mm_trainer.plugins` entry point?"
        )

    def registered(self) -> dict[str, Any]:
        """What is registered now, by id (the installed entry points are not loaded for it)."""
        return dict(self._items)

    def __contains__(self, name: object) -> bool:
        if name not in self._items:
            load_entry_point_plugins()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        load_entry_point_plugins()
        return iter(sorted(self._items))


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


MODEL_REGISTRY = Registry("model")
DATA_REGISTRY = Registry("dataset")
REWARD_REGISTRY = Registry("reward")

model_register = MODEL_REGISTRY.register
data_register = DATA_REGISTRY.register
reward_register = REWARD_REGISTRY.register
