"""Decide where a sub-model's weights come from, in which declared format, and where conversions go."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import CheckpointFormatError
from .formats import normalize_format

RENAMED_SOURCE_KEYS = {
    "dcp_cache_dir": "checkpoint_conversion_dir",
    "dcp_conversion_dir": "checkpoint_conversion_dir",
    "checkpoint_format": "load_format",
}
"""Keys an older config used -> the key that replaced them; a config that sets one is refused."""


@dataclass(frozen=True)
class CheckpointSource:
    """Where to load weights from.

    Attributes:
        path: weights directory/file, or None when the config names no weights (random init).
        declared_format: normalized declared format (``auto`` when not given).
        conversion_dir: where an online DCP conversion is cached, or None.
    """

    path: str | None
    declared_format: str = "auto"
    conversion_dir: str | None = None


def _get(cfg: Any, key: str) -> Any:
    if isinstance(cfg, Mapping):
        return cfg.get(key)
    return getattr(cfg, key, None)


def resolve_checkpoint_source(model_cfg: Mapping[str, Any] | Any) -> CheckpointSource:
    """Resolve a sub-model config (mapping or attribute object) to a :class:`CheckpointSource`.

    Rules: ``checkpoint_path`` wins over ``from_pretrained``; the declared format is ``load_format``
    (normalized here, the one place a config's format is); the conversion cache is
    ``checkpoint_conversion_dir``, the only key that names it.
    """
    for old, new in RENAMED_SOURCE_KEYS.items():
        if _get(model_cfg, old) is not None:
            raise CheckpointFormatError(f"{old} was renamed: set {new} instead")
    path = _get(model_cfg, "checkpoint_path") or _get(model_cfg, "from_pretrained") or None
    conversion_dir = _get(model_cfg, "checkpoint_conversion_dir") or None
    return CheckpointSource(
        path=str(path) if path is not None else None,
        declared_format=normalize_format(_get(model_cfg, "load_format")),
        conversion_dir=str(conversion_dir) if conversion_dir is not None else None,
    )
