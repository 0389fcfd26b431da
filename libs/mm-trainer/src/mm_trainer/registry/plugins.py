"""Import plugin modules so their registrations run.

Plugins come from two places: the module names in ``training.plugin`` (imported at start by
:func:`import_plugins`) and the Python entry-point group ``mm_trainer.plugins`` of installed plugin
packages, imported only when a registry lookup misses (:func:`load_entry_point_plugins`): a run
whose ids are all registered by ``training.plugin`` never pays for importing the others.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from importlib.metadata import entry_points

ENTRY_POINT_GROUP = "mm_trainer.plugins"
_loaded_groups: set[str] = set()


class PluginImportError(ImportError):
    """A plugin named in the config or an entry point failed to import."""


def import_plugins(modules: Iterable[str] = ()) -> list[str]:
    """Import ``modules`` (``training.plugin``); return their names."""
    imported: list[str] = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise PluginImportError(f"training.plugin: cannot import plugin module {name!r}: {exc}") from exc
        imported.append(name)
    return imported


def load_entry_point_plugins(group: str = ENTRY_POINT_GROUP) -> list[str]:
    """Import every installed entry point of ``group`` once; return what this call imported."""
    if group in _loaded_groups:
        return []
    _loaded_groups.add(group)
    imported: list[str] = []
    for ep in entry_points(group=group):
        try:
            ep.load()
        except Exception as exc:
            raise PluginImportError(
                f"entry point {ep.name!r} ({ep.value}) of group {group!r} failed to load: {exc}"
            ) from exc
        imported.append(ep.value)
    return imported
