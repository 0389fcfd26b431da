"""The check a run passes before any heavy work: ``mm-config check`` and the trainer's first step.

:func:`check_config` validates a YAML file completely (plugin sub-schemas, strict types, bounds,
and with ``check_paths`` the existence of every path the run reads) and returns the config with the
warnings a valid config may still deserve; :func:`recheck_config` does the same for a config object
(what the trainer receives).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .errors import Loc, Problem, suggest
from .loader import config_to_data, load_config, validate_with_plugins
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
) -> CheckReport:
    """Load and validate ``path`` as a run would (paths included unless ``check_paths`` is False).

    Raises :class:`~mm_config.ConfigError` listing every problem at once.
    """
    cfg = load_config(path, overrides, world_size, plugins=plugins, check_paths=check_paths)
    return CheckReport(cfg, config_warnings(cfg))


def recheck_config(cfg: TrainConfig, *, check_paths: bool = True) -> CheckReport:
    """:func:`check_config` for a config object, at the world size it was resolved for.

    The trainer calls it first, so a config built in Python gets the same check as a YAML file.
    """
    checked = validate_with_plugins(config_to_data(cfg), cfg.parallel.world_size, check_paths=check_paths)
    return CheckReport(checked, config_warnings(checked))


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
