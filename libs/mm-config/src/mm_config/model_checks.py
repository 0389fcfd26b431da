"""Checks that need the model's own libraries, run by ``mm-config check`` where those are installed.

Some keys can only be judged by the code that builds the model: ``model.config.hf_config`` against the
fields of the upstream config class, ``freeze_groups`` against the model class's module groups, plan
patterns against the module tree the model really has. mm-config imports no torch, so these checks
are plugins of the check: callables installed under the ``mm_config.checks`` entry-point group
(mm-trainer installs its own), each ``check(data) -> (problems, warnings)`` over the raw config data.

They run after the schema pass, on the data *without* the values it refused
(:func:`~mm_config.loader.prune_problems`), so a model is built only from values that passed, and
each reports with YAML paths like the schema does; one check's problems are pruned before the next.
A check that cannot be imported (no torch on a login node) is skipped with a warning.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import Any

from .errors import Problem
from .loader import prune_problems

CHECKS_ENTRY_POINT_GROUP = "mm_config.checks"
"""Entry-point group of the model checks (``model = "mm_trainer.checks.model_checks:model_checks"``)."""

ModelCheck = Callable[[dict[str, Any]], tuple[list[Problem], list[Problem]]]


def _names_a_model(data: dict[str, Any]) -> bool:
    model = data.get("model") if isinstance(data, dict) else None
    return isinstance(model, dict) and bool(model.get("model_id") or model.get("models"))


def run_model_checks(
    data: dict[str, Any], problems: Sequence[Problem] = ()
) -> tuple[list[Problem], list[Problem]]:
    """The problems and warnings of every installed model check on ``data`` pruned of ``problems``
    (nothing to do, and nothing imported, for a config that names no model)."""
    if not _names_a_model(data):
        return [], []
    found: list[Problem] = []
    warnings: list[Problem] = []
    pruned = prune_problems(data, [p.loc for p in problems])
    for ep in sorted(entry_points(group=CHECKS_ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            check: ModelCheck = ep.load()
        except ImportError as exc:
            warnings.append(
                Problem((), f"model checks {ep.name!r} ({ep.value}) skipped: cannot import: {exc}")
            )
            continue
        new, noted = check(pruned)
        found += new
        warnings += noted
        pruned = prune_problems(pruned, [p.loc for p in new])
    return found, warnings


__all__ = ["CHECKS_ENTRY_POINT_GROUP", "ModelCheck", "run_model_checks"]
