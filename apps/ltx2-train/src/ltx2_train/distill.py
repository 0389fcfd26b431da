"""LTX-2 few-step distillation (``model.pipeline.distill`` of ``ltx2_container``): DMD2 around
:class:`~ltx2_train.pipeline.LTX2Pipeline`, on its video and audio streams together.

Sub-models: ``teacher`` (frozen), ``model`` (the student: trains, exports and samples as any LTX-2
transformer, full or LoRA) and ``critic`` (the fake score). The distillation's sigma grid is a
flow-match grid at ``distill.shift`` (LTX-2's own training draws sigmas from a logit-normal instead).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mm_pipelines import (
    DistributionMatchingDistillation,
    FlowMatchScheduler,
    check_distillation_models,
    with_distillation,
)

from ltx2_train.pipeline import LTX2Pipeline

#: The student's sub-model name (as in ordinary training), then the teacher and the critic.
STUDENT, TEACHER, CRITIC = "model", "teacher", "critic"
ROLES = (STUDENT, TEACHER, CRITIC)


def distillation_pipeline(base: LTX2Pipeline, options: Mapping[str, Any]) -> DistributionMatchingDistillation:
    """DMD2 on ``base`` from ``model.pipeline.distill`` (``config_schema.LTX2DistillOptions``)."""
    options = dict(options)
    if "shift" not in options:
        raise ValueError(
            "model.pipeline.distill.shift is required for LTX-2: the time shift of the distillation's sigma grid"
        )
    if base.first_frame_conditioning_p > 0:
        raise ValueError(
            f"model.pipeline.first_frame_conditioning_p={base.first_frame_conditioning_p}: a distillation draws "
            "whole clips (no clean conditioning frames): set it to 0"
        )
    base.scheduler = FlowMatchScheduler(shift=float(options.pop("shift")))
    return DistributionMatchingDistillation.from_options(base, options)


def run_pipeline(options: Mapping[str, Any]) -> LTX2Pipeline | DistributionMatchingDistillation:
    """A run's pipeline from ``model.pipeline``: ``LTX2Pipeline``, and with ``distill`` DMD2 around it."""
    return with_distillation(options, LTX2Pipeline.from_options, distillation_pipeline)


def check_models(sub_models: Mapping[str, Any], trainable: tuple[str, ...]) -> None:
    """Refuse a distillation container without ``model``, ``teacher`` and ``critic``, or with a trained teacher."""
    check_distillation_models(sub_models, trainable, ROLES, (TEACHER,))
