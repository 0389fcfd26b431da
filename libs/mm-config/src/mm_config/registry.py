"""Plugin sub-schemas: pydantic models that validate a model's ``config`` or a dataset's kwargs.

A plugin registers its schema at import time; :func:`mm_config.load_config` imports the modules
in ``training.plugin`` first, so the plugin's own keys are validated in the same pass as the
framework's, with full YAML paths (``model.models.predictor.config.num_layers``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from .errors import RuleViolations, problems_from_validation_error

_MODEL_SCHEMAS: dict[str, type[BaseModel]] = {}
_DATASET_SCHEMAS: dict[str, type[BaseModel]] = {}


def _register(table: dict[str, type[BaseModel]], kind: str, key: str, schema: type[BaseModel]) -> None:
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
        raise TypeError(f"{kind} schema for {key!r} must be a pydantic BaseModel subclass, got {schema!r}")
    old = table.get(key)
    same = old is not None and (old.__module__, old.__qualname__) == (schema.__module__, schema.__qualname__)
    if old is not None and not same:
        raise ValueError(
            f"{kind} id {key!r} already has schema {old.__module__}.{old.__qualname__}; "
            f"refusing to replace it with {schema.__module__}.{schema.__qualname__}"
        )
    table[key] = schema


def register_model_schema(model_id: str, schema: type[BaseModel]) -> type[BaseModel]:
    """Validate ``model.[models.<name>.]config`` of sub-models with this ``model_id`` by ``schema``."""
    _register(_MODEL_SCHEMAS, "model", model_id, schema)
    return schema


def register_dataset_schema(dataset_id: str, schema: type[BaseModel]) -> type[BaseModel]:
    """Validate ``data.dataset`` by ``schema`` when ``data.dataset_id`` is ``dataset_id``."""
    _register(_DATASET_SCHEMAS, "dataset", dataset_id, schema)
    return schema


def unregister_schema(kind: str, key: str) -> None:
    """Remove a registered schema (``kind`` is ``"model"`` or ``"dataset"``); mainly for tests."""
    {"model": _MODEL_SCHEMAS, "dataset": _DATASET_SCHEMAS}[kind].pop(key, None)


def model_schema(model_id: str | None) -> type[BaseModel] | None:
    """The schema registered for ``model_id``, or None."""
    return _MODEL_SCHEMAS.get(model_id) if model_id else None


def dataset_schema(dataset_id: str | None) -> type[BaseModel] | None:
    """The schema registered for ``dataset_id``, or None."""
    return _DATASET_SCHEMAS.get(dataset_id) if dataset_id else None


def validate_plugin_dict(schema: type[BaseModel] | None, value: dict[str, Any]) -> dict[str, Any]:
    """Validate ``value`` by ``schema`` (if any) and return it with defaults filled in.

    Raises :class:`RuleViolations` whose paths are relative to ``value``, so the caller's
    location (e.g. ``model.models.predictor.config``) prefixes them.
    """
    if schema is None:
        return value
    try:
        return schema.model_validate(value).model_dump(mode="json")
    except ValidationError as err:
        raise RuleViolations(problems_from_validation_error(err, schema), rule=False) from None
