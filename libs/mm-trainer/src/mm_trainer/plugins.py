"""Import plugin modules so their registrations run.

Plugins come from two places: the module names in ``training.plugin`` and the
Python entry-point group ``mm_trainer.plugins`` (installed plugin packages).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from importlib.metadata import entry_points

ENTRY_POINT_GROUP = "mm_trainer.plugins"


class PluginImportError(ImportError):
    """A plugin named in the config or an entry point failed to import."""


def import_plugins(
    modules: Iterable[str] = (), *, entry_point_group: str | None = ENTRY_POINT_GROUP
) -> list[str]:
    """Import ``modules`` and every entry point of ``entry_point_group``; return what was imported."""
    imported: list[str] = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise PluginImportError(f"training.plugin: cannot import plugin module {name!r}: {exc}") from exc
        imported.append(name)
    if entry_point_group:
        for ep in entry_points(group=entry_point_group):
            try:
                ep.load()
            except Exception as exc:
                raise PluginImportError(
                    f"entry point {ep.name!r} ({ep.value}) of group {entry_point_group!r} failed to load: {exc}"
                ) from exc
            imported.append(ep.value)
    return imported
