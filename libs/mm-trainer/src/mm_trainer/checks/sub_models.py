"""The container's rules on its sub-models, for ``mm-config check`` and the trainer's preflight: what
``ModelContainer.sub_model_problems`` finds in the ``model`` section (e.g. a distillation's student or
critic whose architecture is not its teacher's), reported at ``model.models.<name>`` before anything is
built. ``ModelContainerHub.build`` refuses the same before building a sub-model."""

from __future__ import annotations

from typing import Any

from mm_config import Problem

from mm_trainer.checks.plan_patterns import validated_model_section
from mm_trainer.model.container import container_class
from mm_trainer.registry.registries import RegistryError

__all__ = ["sub_model_problems"]


def sub_model_problems(data: dict[str, Any]) -> list[Problem]:
    """The problems the container of raw config ``data`` finds with its sub-models (none for the
    single-model form, or when the ``model`` section or its container id did not validate)."""
    model, _ = validated_model_section(data)
    if model is None or not model.is_container:
        return []
    try:
        cls = container_class(model)
    except (RegistryError, TypeError):  # the id check reports it
        return []
    return [Problem(("model", "models", name), why) for name, why in cls.sub_model_problems(model).items()]
