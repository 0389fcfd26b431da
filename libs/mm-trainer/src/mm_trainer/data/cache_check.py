"""A training run's check that its encoder cache was made as its preprocess section says (docs/DESIGN.md
"Latent cache").

An app whose dataset id trains from a latent cache in ``data.data_path``, written from
``data.dataset.preprocess`` by its ``preprocess`` command, registers the section's schema with
:func:`register_preprocess_section`. The trainer then calls :func:`check_cache_made_as_configured`
before it builds any model: the run's section, validated, gives the recipe (:func:`preprocess_recipe`)
that the cache must record, key for key, and the source metadata must be unchanged since the cache was
made (``mm_data.check_cache_made_with``); otherwise the run is refused with a
``mm_data.CacheMismatchError`` naming each key with the cache's and the run's value. A run without a
preprocess section is not checked (nothing says how its cache should have been made). Only the
training data is checked: ``training.validation.data_path`` is another cache, of other clips.
"""

from __future__ import annotations

from typing import Any

from mm_data import check_cache_made_with

from mm_trainer.data.preprocess import preprocess_recipe
from mm_trainer.registry.registries import DATA_REGISTRY

__all__ = ["check_cache_made_as_configured", "register_preprocess_section"]

_SECTIONS: dict[str, Any] = {}


def register_preprocess_section(dataset_id: str, schema: Any) -> None:
    """Declare that ``dataset_id`` trains from a cache that ``data.dataset.preprocess`` (validated by the
    pydantic model ``schema``) describes; the trainer checks one against the other."""
    _SECTIONS[dataset_id] = schema


def check_cache_made_as_configured(data: Any) -> None:
    """Refuse the run when ``data.data_path`` (the cache of ``data.dataset_id``) was not made as
    ``data.dataset.preprocess`` says, or from a source metadata file changed since (see the module
    docstring).

    Raises:
        mm_data.CacheMismatchError: naming every differing key with both values, or the changed source.
    """
    raw = (data.dataset or {}).get("preprocess")
    if not raw or not data.data_path:
        return
    DATA_REGISTRY.get(data.dataset_id)  # loads the plugin that registers the id (and its section)
    schema = _SECTIONS.get(data.dataset_id)
    if schema is None:
        return
    check_cache_made_with(data.data_path, preprocess_recipe(schema.model_validate(raw)))
