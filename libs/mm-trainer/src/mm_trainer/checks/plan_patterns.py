"""Plan patterns checked against the model they will be applied to, built on the meta device, before
any weight is read: each pattern of ``parallel.fsdp_plan``, the ``features`` plans and every
``lora.target_modules`` must match a module, and one that does not is reported at its YAML key with
the segment at fault and the closest name the model has there (``mm_parallel.unmatched_segment``).

The schema pass only sees a pattern's first segment (a sub-model name); a typo past it
(``predictor.blocks.{*}.atn``) used to pass the check and fail at build time without naming the key.
Run by ``mm-config check`` (through the ``mm_config.checks`` entry point, :mod:`mm_trainer.checks.model_checks`)
and by the trainer's preflight.
"""

from __future__ import annotations

import copy
from typing import Any

from mm_config import ModelConfig, Problem
from mm_config.errors import Loc
from mm_parallel import module_paths, pattern_matches, unmatched_segment
from torch import nn

from mm_trainer.checks.hf_config import sub_model_sections
from mm_trainer.model.container import container_class
from mm_trainer.model.hub import ModelHub

__all__ = ["PLAN_PATTERN_KEYS", "meta_container", "plan_pattern_problems", "validated_model_section"]

PLAN_PATTERN_KEYS: tuple[Loc, ...] = (
    ("parallel", "fsdp_plan", "apply_modules"),
    ("parallel", "fsdp_plan", "ignored_modules"),
    ("features", "recompute_plan", "apply_modules"),
    ("features", "compile", "apply_modules"),
    ("features", "activation_offload_plan", "apply_modules"),
)
"""The plan keys whose patterns name module paths of the container (``predictor.blocks.{*}``)."""


def _at(data: Any, loc: Loc) -> Any:
    for part in loc:
        data = data.get(part) if isinstance(data, dict) else None
    return data


def meta_container(model: ModelConfig) -> tuple[nn.Module, dict[str, str]]:
    """The container of a ``model`` section with its sub-models built on the meta device (no weights, no
    LoRA, nothing frozen: the module tree the plans are applied to), and why each sub-model that could
    not be built is missing from it."""
    sub_models, failed = {}, {}
    for name, args in model.sub_models().items():
        try:
            sub_models[name] = ModelHub.build(args, meta_init=True)
        except Exception as exc:  # noqa: BLE001 - reported as a warning; the trainer's own build raises it
            failed[name] = f"{type(exc).__name__}: {exc}"
    return container_class(model)(sub_models, pipeline=None), failed


def validated_model_section(data: dict[str, Any]) -> tuple[ModelConfig | None, set[str]]:
    """The ``model`` section of pruned ``data`` validated without the sub-models whose id the earlier
    checks refused (None when it still does not validate), and the names of those left out."""
    section = copy.deepcopy(data.get("model") or {})
    models = section.get("models")
    left_out = (
        {n for n, sub in models.items() if not (isinstance(sub, dict) and sub.get("model_id"))}
        if isinstance(models, dict)
        else set()
    )
    for name in left_out:
        del models[name]
    if models and not section.get("container_id"):
        section.pop("pipeline", None)  # its container's id was refused: the plain container has no options
    try:
        return ModelConfig.model_validate(section, context={"world_size": 1}), left_out
    except ValueError:  # pydantic's ValidationError
        return None, left_out  # the schema pass reports the model section's problems


def _pattern_lists(data: dict[str, Any]) -> list[tuple[Loc, str | None, list[Any]]]:
    """``(YAML key, sub-model or None for the container, patterns)`` of every plan list in ``data``."""
    lists: list[tuple[Loc, str | None, list[Any]]] = [
        (loc, None, value) for loc in PLAN_PATTERN_KEYS if isinstance(value := _at(data, loc), list) and value
    ]
    for base, section in sub_model_sections(data):
        targets = _at(section, ("lora", "target_modules"))
        if isinstance(targets, list) and targets:
            lists.append(
                (base + ("lora", "target_modules"), base[-1] if len(base) == 3 else "model", targets)
            )
    return lists


def plan_pattern_problems(data: dict[str, Any]) -> tuple[list[Problem], list[Problem]]:
    """``(problems, warnings)``: every plan pattern of raw config ``data`` that matches no module of the
    model built on meta. Patterns of a sub-model that could not be built are not judged (a warning says
    why, unless an earlier problem does)."""
    lists = _pattern_lists(data)
    model_cfg, left_out = validated_model_section(data) if lists else (None, set())
    if model_cfg is None:
        return [], []
    model, failed = meta_container(model_cfg)
    warnings = [
        Problem((), f"plan patterns of sub-model `{name}` not checked: building it on meta failed: {why}")
        for name, why in failed.items()
    ]
    unjudged = left_out | set(failed)
    problems = []
    for loc, sub_model, patterns in lists:
        if sub_model in unjudged:
            continue
        paths = module_paths(getattr(model, sub_model) if sub_model else model)
        for i, pattern in enumerate(patterns):
            if not isinstance(pattern, str) or any(pattern_matches(pattern, p) for p in paths):
                continue
            if sub_model is None and pattern.split(".", 1)[0] in unjudged:
                continue
            problems.append(
                Problem(loc + (i,), f"matches no module: {unmatched_segment(pattern, paths)}", pattern)
            )
    return problems, warnings
