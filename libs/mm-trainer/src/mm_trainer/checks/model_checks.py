"""mm-trainer's model checks for ``mm-config check`` and the trainer's preflight: the ``mm_config.checks``
entry point ``model`` (see :mod:`mm_config.model_checks`)."""

from __future__ import annotations

from typing import Any

from mm_config import Problem, prune_problems

from mm_trainer.checks.hf_config import hf_model_problems
from mm_trainer.checks.plan_patterns import plan_pattern_problems
from mm_trainer.model import registered_names as _registered_names  # noqa: F401 - tells mm-config the ids

__all__ = ["model_checks"]


def model_checks(data: dict[str, Any]) -> tuple[list[Problem], list[Problem]]:
    """``(problems, warnings)`` of raw config ``data``: transformers sub-models' ``config``
    (:mod:`~mm_trainer.checks.hf_config`), then the plan patterns against the model built on meta
    (:mod:`~mm_trainer.checks.plan_patterns`) from the data without the values the first refused."""
    hf_problems = hf_model_problems(data)
    pattern_problems, warnings = plan_pattern_problems(prune_problems(data, [p.loc for p in hf_problems]))
    return hf_problems + pattern_problems, warnings
