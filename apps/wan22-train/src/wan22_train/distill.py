"""Wan2.2 few-step distillation (``model.pipeline.distill``): DMD2 around :class:`Wan22Pipeline`.

Sub-models: ``teacher`` (frozen), ``predictor`` (the student: trains, exports and samples as any Wan
predictor, full or LoRA) and ``critic`` (the fake score); with ``expert: both`` each has a ``_low`` twin,
and every call routes by timestep to the expert that owns it, so each expert's student trains on the
steps of its own timestep range (``Wan22Pipeline.predict``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mm_pipelines import DistributionMatchingDistillation
from mm_pipelines import check_distillation_models as check_models

from wan22_train.pipeline import Wan22Pipeline, low_noise_role

#: The distillation's sub-models besides the student ``predictor``.
TEACHER, CRITIC = "teacher", "critic"


def distillation_pipeline(
    base: Wan22Pipeline, options: Mapping[str, Any]
) -> DistributionMatchingDistillation:
    """DMD2 on ``base`` from ``model.pipeline.distill`` (``config_schema.DistillOptions``)."""
    return DistributionMatchingDistillation.from_options(base, options)


def distillation_roles(expert: str) -> tuple[str, ...]:
    """The sub-models a distillation run must hold for ``expert`` (``all`` or ``both``)."""
    roles = ("predictor", TEACHER, CRITIC)
    return roles + tuple(low_noise_role(r) for r in roles) if expert == "both" else roles


def check_distillation_models(sub_models: Mapping[str, Any], trainable: tuple[str, ...], expert: str) -> None:
    """Refuse a distillation container that lacks a role or trains its teacher, naming what is wrong."""
    roles = distillation_roles(expert)
    teachers = [r for r in roles if r.startswith(TEACHER)]
    check_models(sub_models, trainable, roles, teachers, what=f"model.pipeline.distill (expert: {expert})")
