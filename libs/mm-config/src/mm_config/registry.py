"""Plugin sub-schemas: pydantic models that validate a model's ``config``, a dataset's kwargs and a
pipeline's options.

A plugin registers its schemas at import time, from a module that imports only pydantic and
mm-config (no torch), so that ``mm-config check`` can validate a run on a login node:

- installed packages name that module in the ``mm_config.schemas`` entry-point group
  (:func:`load_schema_entry_points`, called by :func:`mm_config.load_config`);
- modules in ``training.plugin`` are imported before validation too.

The plugin's keys are then validated in the same pass as the framework's, with full YAML paths
(``model.models.predictor.config.num_layers``).
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from .base import PartialConfigModel
from .errors import Problem, RuleViolations, problems_from_validation_error

SchemaKind = Literal["model", "dataset", "pipeline", "reward"]
ENTRY_POINT_GROUP = "mm_config.schemas"
"""Entry-point group of installed schema modules (``wan22 = "wan22_train.config_schema"``)."""

_SCHEMAS: dict[str, dict[str, type[BaseModel]]] = {"model": {}, "dataset": {}, "pipeline": {}, "reward": {}}
_entry_point_problems: list[Problem] | None = None


def _register(kind: SchemaKind, key: str, schema: type[BaseModel]) -> type[BaseModel]:
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
        raise TypeError(f"{kind} schema for {key!r} must be a pydantic BaseModel subclass, got {schema!r}")
    table = _SCHEMAS[kind]
    old = table.get(key)
    same = old is not None and (old.__module__, old.__qualname__) == (schema.__module__, schema.__qualname__)
    if old is not None and not same:
        raise ValueError(
            f"{kind} id {key!r} already has schema {old.__module__}.{old.__qualname__}; "
            f"refusing to replace it with {schema.__module__}.{schema.__qualname__}"
        )
    table[key] = schema
    return schema


def register_model_schema(model_id: str, schema: type[BaseModel]) -> type[BaseModel]:
    """Validate ``model.[models.<name>.]config`` of sub-models with this ``model_id`` by ``schema``."""
    return _register("model", model_id, schema)


def register_dataset_schema(dataset_id: str, schema: type[BaseModel]) -> type[BaseModel]:
    """Validate ``data.dataset`` by ``schema`` when ``data.dataset_id`` is ``dataset_id``.

    The schema may declare two class variables about the ``data`` section's own keys:
    ``needs_data_path`` (True: ``data.data_path`` must be set) and ``reads_data_root`` (False:
    ``data.data_root`` is refused, since nothing would read it); and two about ``data.sources``:
    ``takes_sources`` (False: refused, the dataset reads one data set) and ``one_source_keys`` (``{key: why}``
    of ``data.dataset`` keys that describe one data path, refused together with ``data.sources``).
    """
    return _register("dataset", dataset_id, schema)


def register_pipeline_schema(owner_id: str, schema: type[BaseModel]) -> type[BaseModel]:
    """Validate ``model.pipeline`` by ``schema`` when the pipeline's owner is ``owner_id``: the
    container (``model.container_id``), or in the single-model form the model (``model.model_id``).

    The schema may declare the class variable ``input_dtype_key``: the option that sets the dtype the
    pipeline casts its models' inputs to (when it is set, the rule that sub-models wrapped without
    ``parallel.fsdp_plan.param_dtype`` share one dtype leaves the conversion to the pipeline)."""
    return _register("pipeline", owner_id, schema)


def register_reward_schema(reward_id: str, schema: type[BaseModel]) -> type[BaseModel]:
    """Validate the ``options`` of a ``training.rewards`` entry with this ``id`` by ``schema``. A reward id
    is known to the config only through its schema: a reward plugin registers one (an empty schema for
    a reward without options), from its torch-free schema module, beside its ``@reward_register``."""
    return _register("reward", reward_id, schema)


def unregister_schema(kind: SchemaKind, key: str) -> None:
    """Remove a registered schema (``kind``: ``"model"``, ``"dataset"``, ``"pipeline"`` or
    ``"reward"``); for tests."""
    _SCHEMAS[kind].pop(key, None)


def model_schema(model_id: str | None) -> type[BaseModel] | None:
    """The schema registered for ``model_id``, or None."""
    return _SCHEMAS["model"].get(model_id) if model_id else None


def dataset_schema(dataset_id: str | None) -> type[BaseModel] | None:
    """The schema registered for ``dataset_id``, or None."""
    return _SCHEMAS["dataset"].get(dataset_id) if dataset_id else None


def pipeline_schema(owner_id: str | None) -> type[BaseModel] | None:
    """The ``model.pipeline`` schema registered for a container or model id, or None."""
    return _SCHEMAS["pipeline"].get(owner_id) if owner_id else None


def reward_schema(reward_id: str | None) -> type[BaseModel] | None:
    """The ``options`` schema registered for reward ``reward_id``, or None (an unknown reward)."""
    return _SCHEMAS["reward"].get(reward_id) if reward_id else None


def registered_ids(kind: SchemaKind) -> list[str]:
    """Ids that have a ``kind`` schema, sorted."""
    return sorted(_SCHEMAS[kind])


def load_schema_entry_points() -> list[Problem]:
    """Import every installed ``mm_config.schemas`` entry point (once per process).

    Returns one problem per entry point that failed to import (the same list on later calls), so
    that a broken plugin shows in the report instead of silently leaving its keys unchecked.
    """
    global _entry_point_problems
    if _entry_point_problems is None:
        _entry_point_problems = []
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                ep.load()
            except Exception as exc:  # noqa: BLE001 - any failure is reported, not raised
                message = f"installed schema entry point {ep.name!r} ({ep.value}) failed to import: {exc}"
                _entry_point_problems.append(Problem((), message))
    return list(_entry_point_problems)


def validate_plugin_dict(
    schema: type[BaseModel] | None, value: dict[str, Any], context: Any = None
) -> dict[str, Any]:
    """Validate ``value`` by ``schema`` (if any) and return it as plain data.

    Defaults are filled in, except for a :class:`~mm_config.base.PartialConfigModel`, which keeps
    only the keys ``value`` sets. ``context`` is the caller's validation context (``check_paths``).
    Raises :class:`RuleViolations` whose paths are relative to ``value``, so the caller's location
    (e.g. ``model.models.predictor.config``) prefixes them.
    """
    if schema is None:
        return value
    try:
        model = schema.model_validate(value, context=context)
    except ValidationError as err:
        raise RuleViolations(problems_from_validation_error(err, schema), rule=None) from None
    return model.model_dump(mode="json", exclude_unset=issubclass(schema, PartialConfigModel))
