"""The registry of key maps by model type: the tables shipped with mm-checkpoint
(:mod:`.model_key_maps`, registered on first use), those applications register, and those advertised
under the ``mm_checkpoint.weight_transforms`` entry-point group.

It sits above :mod:`.key_maps` (the rule machinery) and :mod:`.model_key_maps` (the shipped tables),
so neither of those imports the other's user.
"""

from __future__ import annotations

import types
from importlib.metadata import entry_points
from typing import Any

from .errors import KeyMapError
from .key_maps import IDENTITY, WeightTransform
from .model_key_maps import builtin_key_map, builtin_model_types

KEY_MAP_REGISTRY: dict[str, WeightTransform] = {}
"""Registered key maps by model type (the shipped tables join on first use, applications add theirs)."""


def register_weight_transform(
    name: str, transform: WeightTransform | None = None, *, overwrite: bool = False
) -> Any:
    """Register ``transform`` under ``name``; usable as a decorator on a zero-argument class.

    Raises:
        KeyMapError: ``name`` is taken by a different transform (unless ``overwrite``; re-registering an
            equal table, e.g. when a plugin module is imported twice, is a no-op) or the object lacks
            plan_load/plan_export.
    """

    def _register(obj: Any) -> Any:
        instance = obj() if isinstance(obj, type) else obj
        if not isinstance(instance, WeightTransform):
            raise KeyMapError(f"weight transform {name!r} must implement plan_load/plan_export, got {obj!r}")
        taken = KEY_MAP_REGISTRY.get(name)
        if taken is not None and not overwrite and taken != instance:
            raise KeyMapError(
                f"weight transform {name!r} is already registered; pass overwrite=True to replace it"
            )
        KEY_MAP_REGISTRY[name] = instance
        return obj

    return _register if transform is None else _register(transform)


ENTRY_POINT_GROUP = "mm_checkpoint.weight_transforms"


def load_entry_point_transforms() -> None:
    """Import plugins advertising key maps under the ``mm_checkpoint.weight_transforms`` entry-point group.

    An entry point may name a module (importing it registers its tables) or a transform object/class,
    registered under the entry point's name.
    """
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        obj = ep.load()
        if ep.name not in KEY_MAP_REGISTRY and not isinstance(obj, types.ModuleType):
            register_weight_transform(ep.name, obj)


def known_model_types() -> list[str]:
    """Every model type :func:`get_weight_transform` can resolve: registered, shipped with mm-checkpoint
    (:mod:`.model_key_maps`) or advertised under the entry-point group (not imported here)."""
    advertised = {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(set(KEY_MAP_REGISTRY) | set(builtin_model_types()) | advertised)


def get_weight_transform(model_type: str | None) -> WeightTransform:
    """The transform registered as ``model_type`` (a shipped table registers itself on first use),
    :data:`IDENTITY` for None.

    Raises:
        KeyMapError: unknown name, listing the known ones.
    """
    if model_type is None:
        return IDENTITY
    if model_type not in KEY_MAP_REGISTRY:
        if model_type in builtin_model_types():
            register_weight_transform(model_type, builtin_key_map(model_type))
        else:
            load_entry_point_transforms()
    try:
        return KEY_MAP_REGISTRY[model_type]
    except KeyError:
        raise KeyMapError(
            f"no weight transform registered as {model_type!r}; known model types: {known_model_types()} "
            f"(or import the plugin that registers it)"
        ) from None
