"""``training.stage_dir``: point every sub-model's weights source at its node-local copy.

Runs before the model is built (``from_pretrained`` may read the weights while building). What is
copied is what the load reads: ``checkpoint_path`` or ``from_pretrained``; with ``load_format: dcp``
the conversion cache once it is complete and holds the source's current content (the conversion
itself writes to the shared cache, so the first run, or the first after the source changed, converts
there and later runs stage the result; rank 0 decides, by the content hashes the cache recorded).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from mm_checkpoint import (
    cache_content_change,
    looks_like_dcp_checkpoint_dir,
    resolve_checkpoint_source,
    stage_on_node,
)
from mm_checkpoint.runtime import on_rank0
from mm_config import ModelConfig, SubModelConfig

logger = logging.getLogger("mm_trainer")


def stage_model_weights(model: ModelConfig, stage_dir: str) -> ModelConfig:
    """A copy of ``model`` whose weights sources are node-local copies under ``stage_dir``
    (collective: every rank calls it)."""
    root = os.path.expandvars(stage_dir)
    if not model.models:
        return model.model_copy(update=_staged_source(model, root))
    models = {name: sub.model_copy(update=_staged_source(sub, root)) for name, sub in model.models.items()}
    return model.model_copy(update={"models": models})


def _staged_source(sub: SubModelConfig, root: str) -> dict[str, Any]:
    """The keys of ``sub`` to replace by node-local copies (none when it names no weights)."""
    source = resolve_checkpoint_source(sub)
    if source.path is None:
        return {}
    cache = source.conversion_dir
    if source.declared_format == "dcp" and cache and cache != source.path:
        stale = on_rank0(lambda: _stale_cache(source.path, cache))  # the same answer on every rank
        if stale:
            logger.warning("%s: DCP conversion cache %s; converting on shared storage", cache, stale)
            return {}
        return {"checkpoint_conversion_dir": str(stage_on_node(cache, root).path)}
    key = "checkpoint_path" if sub.checkpoint_path == source.path else "from_pretrained"
    return {key: str(stage_on_node(source.path, root).path)}


def _stale_cache(source: str, cache: str) -> str | None:
    """Why the conversion cache ``cache`` may not be staged for ``source`` (None: it may)."""
    if not looks_like_dcp_checkpoint_dir(cache):
        return "not complete yet"
    if not os.path.exists(source):  # the load uses the cache of a deleted source, with a warning
        return None
    change = cache_content_change(source, cache)
    return f"out of date ({change})" if change else None


__all__ = ["stage_model_weights"]
