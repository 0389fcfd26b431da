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
    distillation_architecture_problems,
    with_distillation,
)

from ltx2_train.pipeline import LTX2Pipeline
from ltx2_train.predictor import TRANSFORMER_DEFAULTS, transformer_config
from ltx2_train.reward_modes import REWARD_MODES, check_whole_clips, reward_mode_pipeline

#: The student's sub-model name (as in ordinary training), then the teacher and the critic.
STUDENT, TEACHER, CRITIC = "model", "teacher", "critic"
PREDICTOR_ID = "ltx2_predictor"
ROLES = (STUDENT, TEACHER, CRITIC)


def distillation_pipeline(base: LTX2Pipeline, options: Mapping[str, Any]) -> DistributionMatchingDistillation:
    """DMD2 on ``base`` from ``model.pipeline.distill`` (``config_schema.LTX2DistillOptions``)."""
    options = dict(options)
    if "shift" not in options:
        raise ValueError(
            "model.pipeline.distill.shift is required for LTX-2: the time shift of the distillation's sigma grid"
        )
    check_whole_clips(base, "a distillation")
    base.scheduler = FlowMatchScheduler(shift=float(options.pop("shift")))
    return DistributionMatchingDistillation.from_options(base, options)


def run_pipeline(options: Mapping[str, Any]) -> Any:
    """A run's pipeline from ``model.pipeline``: ``LTX2Pipeline``; with ``distill`` DMD2 around it; with
    ``grpo`` / ``nft`` Flow-GRPO / DiffusionNFT around it (:mod:`ltx2_train.reward_modes`)."""
    options = dict(options)
    modes = {key: options.pop(key, None) for key in REWARD_MODES}
    pipeline = with_distillation(options, LTX2Pipeline.from_options, distillation_pipeline)
    for key, mode_options in modes.items():
        if mode_options is not None:
            return reward_mode_pipeline(pipeline, key, mode_options)
    return pipeline


def architecture_problems(model_section: Any) -> dict[str, str]:
    """The student ``model`` and the ``critic`` of a distillation (``model.pipeline.distill``) whose
    architecture is not the teacher's, each with the differing keys: ``LTX2VideoTransformer3DModel``'s
    arguments from the config sections and the sources' ``config.json`` alone (before any weight is read;
    a sub-model whose shape cannot be told that way is left to its build to refuse)."""
    if not dict(getattr(model_section, "pipeline", None) or {}).get("distill"):
        return {}
    subs = model_section.sub_models()
    pairs = {role: TEACHER for role in (STUDENT, CRITIC) if role in subs and TEACHER in subs}
    architectures = {name: _architecture(subs[name]) for name in {*pairs, *pairs.values()}}
    return distillation_architecture_problems(architectures, pairs)


def _architecture(args: Any) -> dict[str, Any] | None:
    """A sub-model's model id and, for an LTX-2 transformer, every constructor argument (defaults filled
    in, lists for tuples); None when its shape cannot be read without building it."""
    if args.model_id != PREDICTOR_ID:
        return {"model_id": args.model_id}
    try:
        arguments = {**TRANSFORMER_DEFAULTS, **transformer_config(args)}
    except (ValueError, OSError):
        return None
    return {"model_id": args.model_id, **{k: _plain(v) for k, v in arguments.items()}}


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def check_models(sub_models: Mapping[str, Any], trainable: tuple[str, ...]) -> None:
    """Refuse a distillation container without ``model``, ``teacher`` and ``critic``, or with a trained teacher."""
    check_distillation_models(sub_models, trainable, ROLES, (TEACHER,))
