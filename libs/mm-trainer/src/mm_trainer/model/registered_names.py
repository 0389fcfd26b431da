"""What the registries hold, reported to mm-config's check of registered names (``mm_config.known_ids``).

A plugin module listed in ``training.plugin`` registers its model classes, containers, datasets, chat
templates and multimodal plugins when it is imported; reporting the registries makes those names known to
``mm-config check`` and the trainer's preflight with no declaration of their own. (Installed plugins that
are only imported on a registry miss declare their names in their ``mm_config.schemas`` module.)
"""

from __future__ import annotations

from collections.abc import Iterable

from mm_config import register_id_provider
from mm_data import MM_PLUGINS, TEMPLATES

from mm_trainer.model.container import ModelContainer
from mm_trainer.registry.registries import DATA_REGISTRY, MODEL_REGISTRY

__all__ = ["registered_names"]


def _is_container(obj: object) -> bool:
    return isinstance(obj, type) and issubclass(obj, ModelContainer)


def registered_names(kind: str) -> Iterable[str]:
    """The names of ``kind`` (an ``mm_config.ID_KINDS`` kind) registered in this process so far."""
    if kind in ("model", "container"):
        models = MODEL_REGISTRY.registered()
        return [name for name, obj in models.items() if _is_container(obj) == (kind == "container")]
    if kind == "dataset":
        return list(DATA_REGISTRY.registered())
    if kind == "template":
        return list(TEMPLATES)
    if kind == "mm_plugin":
        return list(MM_PLUGINS)
    return []


register_id_provider(registered_names)
