"""``model.config`` of transformers models checked against the model class, before anything is built:
``hf_config`` keys against the fields of the upstream config class (nested ``*_config`` sections against
their sub-config classes), ``freeze_groups`` against the class's module groups, ``architecture``
against transformers' classes.

Why here: transformers config classes swallow unknown keys (``PreTrainedConfig`` keeps any keyword as an
attribute), so a misspelt ``hf_config`` key trained silently; and which config class applies depends on
the model class: a registered :class:`~mm_trainer.HFModel` subclass, or for ``hf_causal_lm`` the class
``architecture`` or the source's ``config.json`` names. The registry and transformers know that,
mm-config (no torch, no transformers) cannot, and a plugin's torch-free schema module could only
repeat it. So the check is mm-trainer's, offered to ``mm-config check`` through the
``mm_config.checks`` entry point (:mod:`mm_trainer.checks.model_checks`) and run by the trainer's preflight
the same way. It reads at most the source's ``config.json``.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator
from functools import cache
from types import SimpleNamespace
from typing import Any

from mm_config import Problem
from mm_config.errors import Loc, suggest

from mm_trainer.model.hf_model import HFCausalLM, HFModel, hf_class, hf_model_class, import_transformers
from mm_trainer.registry.registries import MODEL_REGISTRY

__all__ = ["config_fields", "hf_model_problems"]


def sub_model_sections(data: dict[str, Any]) -> Iterator[tuple[Loc, dict[str, Any]]]:
    """``(YAML location, raw section)`` of every sub-model of raw config data."""
    model = data.get("model")
    if not isinstance(model, dict):
        return
    models = model.get("models")
    if isinstance(models, dict) and models:
        for name, section in models.items():
            if isinstance(section, dict):
                yield ("model", "models", name), section
    elif model.get("model_id"):
        yield ("model",), model


def hf_model_problems(data: dict[str, Any]) -> list[Problem]:
    """The problems of every transformers sub-model's ``config`` in raw config ``data``."""
    out: list[Problem] = []
    for base, section in sub_model_sections(data):
        options = section.get("config") if isinstance(section.get("config"), dict) else {}
        model_class = _model_class(section, options, base + ("config", "architecture"), out)
        if model_class is None:
            continue
        overrides = options.get("hf_config")
        if isinstance(overrides, dict):
            out += _hf_config_problems(model_class.config_class, overrides, base + ("config", "hf_config"))
        groups = options.get("freeze_groups")
        if isinstance(groups, list):
            out += _freeze_group_problems(model_class, groups, base + ("config", "freeze_groups"))
    return out


def _model_class(
    section: dict[str, Any], options: dict[str, Any], loc: Loc, out: list[Problem]
) -> type | None:
    """The :class:`HFModel` class a section builds, or None (not a transformers model, or unknown id)."""
    model_id = section.get("model_id")
    if model_id not in MODEL_REGISTRY:
        return None  # not ours to judge: the id check reports an unknown id
    cls = MODEL_REGISTRY.get(model_id)
    if isinstance(cls, type) and issubclass(cls, HFModel):
        return cls
    if cls is not HFCausalLM:
        return None
    architecture = options.get("architecture")
    transformers = import_transformers(f"model {model_id!r}")
    if architecture is not None and not isinstance(getattr(transformers, str(architecture), None), type):
        models = [n for n in dir(transformers) if n.endswith(("ForCausalLM", "ForConditionalGeneration"))]
        out.append(
            Problem(
                loc,
                f"not a transformers model class; {suggest(str(architecture), models, 'class')}",
                architecture,
            )
        )
        return None
    sources = {key: section.get(key) for key in ("from_pretrained", "checkpoint_path")}
    try:
        return hf_model_class(hf_class(SimpleNamespace(model_id=model_id, config=options, **sources)))
    except ValueError:  # no config.json to name the class: the source's own problem, reported where it is
        return None


@cache
def config_fields(config_class: type) -> frozenset[str]:
    """The keys a transformers config class reads: its fields and ``__init__`` keywords, what its default
    instance serializes, and its ``attribute_map`` aliases."""
    names = (
        {f.name for f in dataclasses.fields(config_class)}
        if dataclasses.is_dataclass(config_class)
        else set()
    )
    params = inspect.signature(config_class.__init__).parameters.values()
    names |= {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self"}
    names |= set(config_class().to_dict())
    names |= set(getattr(config_class, "attribute_map", None) or {})
    return frozenset(names)


def _hf_config_problems(config_class: type, overrides: dict[str, Any], loc: Loc) -> list[Problem]:
    fields = config_fields(config_class)
    sub_configs = getattr(config_class, "sub_configs", None) or {}
    out: list[Problem] = []
    for key, value in overrides.items():
        if key not in fields:
            hint = suggest(str(key), fields, "field")
            out.append(
                Problem(loc + (key,), f"not a field of transformers' {config_class.__name__}; {hint}", value)
            )
        elif (
            isinstance(value, dict)
            and isinstance(sub_configs.get(key), type)
            and hasattr(sub_configs[key], "to_dict")
        ):
            out += _hf_config_problems(sub_configs[key], value, loc + (key,))
    return out


def _freeze_group_problems(model_class: type, groups: list[Any], loc: Loc) -> list[Problem]:
    known = sorted(getattr(model_class, "module_groups", None) or {})
    name = (
        model_class.upstream_class().__name__
        if hasattr(model_class, "upstream_class")
        else model_class.__name__
    )
    return [
        Problem(
            loc + (i,),
            f"{name} has no module group `{group}`; {suggest(str(group), known, 'module group')}",
            group,
        )
        for i, group in enumerate(groups)
        if group not in known
    ]
