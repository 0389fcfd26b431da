"""The check a run passes before any heavy work: ``mm-config check`` and the trainer's first step.

:func:`check_config` validates a YAML file completely, in one report: plugin sub-schemas, strict
types, bounds, every registered name the config uses (model, container and dataset ids, templates,
multimodal plugins, attention implementations: :mod:`mm_config.known_ids`), with ``check_paths`` the
existence of every path the run reads, and with ``model_checks`` what only the model's libraries can
judge (``hf_config`` keys, freeze groups, plan patterns against the model built on meta:
:mod:`mm_config.model_checks`). It returns the config with the warnings a valid config may still
deserve; :func:`recheck_config` does the same for a config object (what the trainer receives).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError, Loc, Problem, suggest
from .loader import apply_overrides, config_to_data, load_plugins, read_yaml, validate_config
from .model_checks import run_model_checks
from .registry import SchemaKind, dataset_schema, model_schema, pipeline_schema, registered_ids
from .root import TrainConfig

_SCHEMA_OF = {"model": model_schema, "dataset": dataset_schema, "pipeline": pipeline_schema}


@dataclass
class CheckReport:
    """A config that passed the check, and what still deserves a warning."""

    config: TrainConfig
    warnings: list[Problem] = field(default_factory=list)


def check_config(
    path: str | Path,
    overrides: Sequence[str] | None = None,
    world_size: int | None = None,
    *,
    check_paths: bool = True,
    plugins: bool = True,
    ranks_per_node: int | None = None,
    model_checks: bool = True,
) -> CheckReport:
    """Load and validate ``path`` as a run would (paths included unless ``check_paths`` is False), with
    ``ranks_per_node`` ranks on each node (see :func:`~mm_config.validate_config`). Registered names are
    checked with the plugins (``plugins``), the model checks run with ``model_checks``.

    Raises :class:`~mm_config.ConfigError` listing every problem at once.
    """
    raw = read_yaml(path)
    if not raw:
        empty = Problem((), "the config file is empty (or only comments): nothing to run")
        raise ConfigError([empty], str(path))
    data = apply_overrides(raw, overrides or [])
    return _check(data, world_size, str(path), check_paths, plugins, ranks_per_node, model_checks)


def recheck_config(cfg: TrainConfig, *, check_paths: bool = True, model_checks: bool = True) -> CheckReport:
    """:func:`check_config` for a config object, at the world size it was resolved for.

    The trainer calls it first, so a config built in Python gets the same check as a YAML file.
    """
    data = config_to_data(cfg)
    return _check(data, cfg.parallel.world_size, None, check_paths, True, None, model_checks)


def _check(
    data: dict[str, Any],
    world_size: int | None,
    source: str | None,
    check_paths: bool,
    plugins: bool,
    ranks_per_node: int | None,
    model_checks: bool,
) -> CheckReport:
    """Plugins, the schema pass (with registered names when the plugins are loaded) and the model checks,
    in one report."""
    problems = load_plugins(data) if plugins else []
    cfg = None
    try:
        cfg = validate_config(
            data,
            world_size,
            source,
            check_paths=check_paths,
            ranks_per_node=ranks_per_node,
            check_ids=plugins,
        )
    except ConfigError as err:
        problems += err.problems
    warnings: list[Problem] = []
    if model_checks and plugins:  # the model checks build through the plugins' registrations
        found, warnings = run_model_checks(data, problems)
        problems += found
    if problems or cfg is None:
        sections = list(TrainConfig.model_fields)
        problems.sort(key=lambda p: sections.index(p.loc[0]) if p.loc and p.loc[0] in sections else -1)
        raise ConfigError(problems, source)
    return CheckReport(cfg, config_warnings(cfg) + warnings)


def config_warnings(cfg: TrainConfig) -> list[Problem]:
    """What a valid config may still get wrong: a long run that saves nothing, and plugin sections
    that no registered schema checked (their keys meet the plugin only when it builds)."""
    return _save_warnings(cfg) + _unchecked_sections(cfg)


def _save_warnings(cfg: TrainConfig) -> list[Problem]:
    t = cfg.training
    if t.save is not None or t.train_iters <= t.save_interval:
        return []
    metrics = " and no metrics files (training.log_dir is null too)" if t.log_dir is None else ""
    return [
        Problem(
            ("training", "save"),
            f"null: this run of {t.train_iters} steps writes no checkpoint (one is due every "
            f"{t.save_interval} steps){metrics}; set training.save to keep its results",
        )
    ]


def _unchecked_sections(cfg: TrainConfig) -> list[Problem]:
    out: list[Problem] = []
    m = cfg.model
    for name, sub in m.sub_models().items():
        base: Loc = ("model", "models", name) if m.is_container else ("model",)
        out += _unchecked(base + ("config",), "model", sub.model_id, sub.config)
    owner = m.container_id if m.is_container else m.model_id
    out += _unchecked(("model", "pipeline"), "pipeline", owner, m.pipeline)
    out += _unchecked(("data", "dataset"), "dataset", cfg.data.dataset_id, cfg.data.dataset)
    return out


def _unchecked(loc: Loc, kind: SchemaKind, owner: str | None, section: dict) -> list[Problem]:
    if not section or _SCHEMA_OF[kind](owner) is not None:
        return []
    hint = suggest(owner or "", registered_ids(kind), f"{kind} id")
    hint = f" ({hint})" if hint.startswith("did you mean") else ""
    return [
        Problem(
            loc,
            f"no {kind} schema is registered for `{owner}`{hint}, so these keys are not checked "
            "before the run",
        )
    ]


__all__ = ["CheckReport", "check_config", "config_warnings", "recheck_config"]
