"""Decide where a sub-model's weights come from, in which declared format, and where conversions go."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .formats import normalize_format
from .layout import looks_like_dcp_checkpoint_dir

_CONVERSION_DIR_KEYS = ("checkpoint_conversion_dir", "dcp_cache_dir", "dcp_conversion_dir", "checkpoint_path")
_FORMAT_KEYS = ("load_format", "checkpoint_format")


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


def _first(cfg: Any, keys: tuple[str, ...]) -> Any:
    for key in keys:
        value = _get(cfg, key)
        if value not in (None, ""):
            return value
    return None


def resolve_checkpoint_source(model_cfg: Mapping[str, Any] | Any) -> CheckpointSource:
    """Resolve a sub-model config (mapping or attribute object) to a :class:`CheckpointSource`.

    Rules: ``checkpoint_path`` wins over ``from_pretrained``; the declared format is ``load_format``
    (or ``checkpoint_format``); the conversion dir is the first set of ``checkpoint_conversion_dir``,
    ``dcp_cache_dir``, ``dcp_conversion_dir``, ``checkpoint_path``. When the declared format is ``dcp``,
    no explicit conversion dir is set, ``checkpoint_path`` is not DCP yet and ``from_pretrained`` is set,
    ``checkpoint_path`` serves as the conversion cache and ``from_pretrained`` as the source.
    """
    checkpoint_path = _get(model_cfg, "checkpoint_path") or None
    from_pretrained = _get(model_cfg, "from_pretrained") or None
    declared = normalize_format(_first(model_cfg, _FORMAT_KEYS))
    conversion_dir = _first(model_cfg, _CONVERSION_DIR_KEYS)
    path = checkpoint_path or from_pretrained
    explicit_cache = _first(model_cfg, _CONVERSION_DIR_KEYS[:3]) is not None
    if (
        declared == "dcp"
        and checkpoint_path
        and from_pretrained
        and not explicit_cache
        and not looks_like_dcp_checkpoint_dir(checkpoint_path)
    ):
        path = from_pretrained
    return CheckpointSource(
        path=str(path) if path is not None else None,
        declared_format=declared,
        conversion_dir=str(conversion_dir) if conversion_dir is not None else None,
    )
