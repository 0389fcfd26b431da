"""mm-trainer's model checks for ``mm-config check`` and the trainer's preflight: the ``mm_config.checks``
entry point ``model`` (see :mod:`mm_config.model_checks`)."""

from __future__ import annotations

from typing import Any

from mm_config import Problem, prune_problems

from mm_trainer.checks.hf_config import hf_model_problems
from mm_trainer.checks.plan_patterns import plan_pattern_problems
from mm_trainer.checks.sub_models import sub_model_problems
from mm_trainer.model import registered_names as _registered_names  # noqa: F401 - tells mm-config the ids

__all__ = ["model_checks"]


def model_checks(data: dict[str, Any]) -> tuple[list[Problem], list[Problem]]:
    """``(problems, warnings)`` of raw config ``data``: transformers sub-models' ``config``
    (:mod:`~mm_trainer.checks.hf_config`), the container's rules on its sub-models
    (:mod:`~mm_trainer.checks.sub_models`), then the plan patterns against the model built on meta
    (:mod:`~mm_trainer.checks.plan_patterns`), the last two on the data without the values the first
    refused (a sub-model the container's rules refuse still has its module tree: its patterns are judged)."""
    hf_problems = hf_model_problems(data)
    pruned = prune_problems(data, [p.loc for p in hf_problems])
    pattern_problems, warnings = plan_pattern_problems(pruned)
    return hf_problems + sub_model_problems(pruned) + pattern_problems, warnings
