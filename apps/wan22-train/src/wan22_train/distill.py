"""Wan2.2 few-step distillation (``model.pipeline.distill``): DMD2 around :class:`Wan22Pipeline`.

Sub-models: ``teacher`` (frozen), ``predictor`` (the student: trains, exports and samples as any Wan
predictor, full or LoRA) and ``critic`` (the fake score); with ``expert: both`` each has a ``_low`` twin,
and every call routes by timestep to the expert that owns it, so each expert's student trains on the
steps of its own timestep range (``Wan22Pipeline.predict``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mm_pipelines import DistributionMatchingDistillation, distillation_architecture_problems
from mm_pipelines import check_distillation_models as check_models

from wan22_train.pipeline import Wan22Pipeline, low_noise_role
from wan22_train.predictor import predictor_config

#: The distillation's sub-models besides the student ``predictor``.
TEACHER, CRITIC = "teacher", "critic"
PREDICTOR_ID = "wan2_2_predictor"


def distillation_pipeline(
    base: Wan22Pipeline, options: Mapping[str, Any]
) -> DistributionMatchingDistillation:
    """DMD2 on ``base`` from ``model.pipeline.distill`` (``config_schema.DistillOptions``)."""
    return DistributionMatchingDistillation.from_options(base, options)


def distillation_roles(expert: str) -> tuple[str, ...]:
    """The sub-models a distillation run must hold for ``expert`` (``all`` or ``both``)."""
    roles = ("predictor", TEACHER, CRITIC)
    return roles + tuple(low_noise_role(r) for r in roles) if expert == "both" else roles


def teachers_of(expert: str) -> dict[str, str]:
    """Each student and critic of a distillation for ``expert`` and the teacher it must match: the
    low-noise ones (``expert: both``) the low-noise teacher."""
    pairs = {"predictor": TEACHER, CRITIC: TEACHER}
    if expert == "both":
        pairs |= {low_noise_role(role): low_noise_role(TEACHER) for role in ("predictor", CRITIC)}
    return pairs


def architecture_problems(model_section: Any) -> dict[str, str]:
    """The students and critics of a distillation (``model.pipeline.distill``) whose architecture is not
    their teacher's, each with the differing keys, from the sub-models' config sections and their
    sources' ``config.json`` alone (before any weight is read; a sub-model whose shape cannot be told
    that way is left to its build to refuse)."""
    options = dict(getattr(model_section, "pipeline", None) or {})
    if not options.get("distill"):
        return {}
    subs = model_section.sub_models()
    pairs = {r: t for r, t in teachers_of(options.get("expert", "all")).items() if r in subs and t in subs}
    architectures = {name: _architecture(subs[name]) for name in {*pairs, *pairs.values()}}
    return distillation_architecture_problems(architectures, pairs)


def _architecture(args: Any) -> dict[str, Any] | None:
    """A sub-model's model id and, for a Wan predictor, its ``WanDiTConfig`` fields; None when its shape
    cannot be read without building it (no ``config.json`` and no ``config``)."""
    if args.model_id != PREDICTOR_ID:
        return {"model_id": args.model_id}
    try:
        return {"model_id": args.model_id, **dataclasses.asdict(predictor_config(args))}
    except (ValueError, OSError):
        return None


def check_distillation_models(sub_models: Mapping[str, Any], trainable: tuple[str, ...], expert: str) -> None:
    """Refuse a distillation container that lacks a role or trains its teacher, naming what is wrong."""
    roles = distillation_roles(expert)
    teachers = [r for r in roles if r.startswith(TEACHER)]
    check_models(sub_models, trainable, roles, teachers, what=f"model.pipeline.distill (expert: {expert})")
