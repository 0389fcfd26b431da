"""The config's FSDP plan (mm-config, pydantic) and the library's (mm-parallel, dataclasses) agree on
every field, default and accepted value; ``fsdp_plan_from_config`` maps one onto the other.

Fields are read by introspection (``model_fields`` / ``dataclasses.fields``), and every field is probed
with every YAML value below, so a field or an accepted value added on one side only fails here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from mm_config import FSDPPlanConfig, SubPlanConfig
from mm_parallel import FSDPPlan, SubPlan
from mm_trainer import fsdp_plan_from_config

PAIRS = [(FSDPPlanConfig, FSDPPlan), (SubPlanConfig, SubPlan)]

#: YAML values of every kind a plan field might take, the edge of each accepted range included.
PROBES: list[Any] = [
    None, True, False, -1, 0, 1, 2, 1.5, "", "auto", "x",
    "bf16", "BF16", " fp32 ", "float32", "bfloat16", "half", "float", "torch.float16", "bf32",
    [], ["a.{*}"], ["a.{0-3}", "b.*.c?"], ["a.{3-1}"], ["a.{x}"], ["a{"], [" a"], [""], ["a", "a"], [1],
    {}, {"te": {}}, {"te": None}, {"te": "x"}, {"te": {"shard_size": 2}}, {"te": {"shard_size": 0}},
    {"te": {"shard_size": -1}}, {"te": {"reshard_after_forward": 2}}, {"te": {"enabled": False}},
]  # fmt: skip


def _config_fields(config_cls: type) -> set[str]:
    return set(config_cls.model_fields)


def _library_fields(library_cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(library_cls)}


def _to_library(config: FSDPPlanConfig | SubPlanConfig) -> FSDPPlan | SubPlan:
    if isinstance(config, SubPlanConfig):
        return fsdp_plan_from_config(FSDPPlanConfig(sub_plans={"te": config})).sub_plans["te"]
    return fsdp_plan_from_config(config)


def _outcome(build: Any, *args: Any) -> Any:
    """``build(*args)``, or ``"refused"`` when building raises the ValueError both sides promise."""
    try:
        return build(*args)
    except ValueError:
        return "refused"


def _via_config(config_cls: type, name: str, value: Any) -> FSDPPlan | SubPlan:
    return _to_library(config_cls.model_validate({name: value}))


def _via_library(library_cls: type, name: str, value: Any) -> FSDPPlan | SubPlan:
    return library_cls.from_dict({name: value})


@pytest.mark.parametrize(("config_cls", "library_cls"), PAIRS)
def test_both_declare_the_same_fields(config_cls: type, library_cls: type) -> None:
    assert _config_fields(config_cls) == _library_fields(library_cls)


@pytest.mark.parametrize(("config_cls", "library_cls"), PAIRS)
def test_defaults_are_the_same(config_cls: type, library_cls: type) -> None:
    converted, library = _to_library(config_cls()), library_cls()
    for name in _library_fields(library_cls):
        assert getattr(converted, name) == getattr(library, name), name


@pytest.mark.parametrize(
    ("config_cls", "library_cls", "name"),
    [(c, lib, name) for c, lib in PAIRS for name in sorted(_library_fields(lib))],
)
def test_each_field_accepts_and_refuses_the_same_values(
    config_cls: type, library_cls: type, name: str
) -> None:
    for value in PROBES:
        from_config = _outcome(_via_config, config_cls, name, value)
        from_library = _outcome(_via_library, library_cls, name, value)
        assert from_config == from_library, f"{name}: {value!r}"


def test_the_probes_cover_acceptance_and_refusal_of_every_field() -> None:
    for _, library_cls in PAIRS:
        for name in _library_fields(library_cls):
            outcomes = [_outcome(_via_library, library_cls, name, v) == "refused" for v in PROBES]
            assert any(outcomes) and not all(outcomes), name
