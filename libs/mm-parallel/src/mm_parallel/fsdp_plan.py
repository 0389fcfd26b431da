"""FSDPPlan: the declarative FSDP2 plan (YAML section ``parallel.fsdp_plan``) as data."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from mm_parallel.patterns import check_pattern

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
    "torch.float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "torch.bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "torch.float16": torch.float16,
}
"""Accepted dtype names (lower-cased, stripped); the config's ``DType`` accepts the same set."""

PLAN_KEY = "parallel.fsdp_plan"


def parse_dtype(value: str | torch.dtype | None, key: str = "dtype") -> torch.dtype | None:
    """Parse a name of :data:`DTYPES` (``"bf16"``, ``"float32"``, ...), a torch dtype, or None."""
    if value is None or isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and value.strip().lower() in DTYPES:
        return DTYPES[value.strip().lower()]
    raise ValueError(f"{key}: {value!r} is not a dtype; expected one of {sorted(DTYPES)} or null")


def _check_keys(mapping: Mapping[str, Any], cls: type, where: str) -> None:
    known = [f.name for f in dataclasses.fields(cls)]
    for key in mapping:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {known}"
            raise ValueError(f"{where}: unknown key {key!r}{hint}")


def _check_type(value: Any, types: type | tuple[type, ...], key: str, expected: str) -> None:
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
        raise ValueError(f"{key}: expected {expected}, got {value!r}")


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


@dataclass
class SubPlan:
    """Per-sub-model override of the plan (``parallel.fsdp_plan.sub_plans.<name>``).

    Attributes:
        shard_size: ranks the sub-model is sharded over (a positive integer); None = the
            global FSDP mesh. Smaller than the world: a 2-D (replicate, shard) mesh, which for a
            trainable sub-model is HSDP.
        reshard_after_forward: overrides the plan's value when not None.
        cpu_offload: overrides the plan's value when not None.
        enabled: False = not sharded: a frozen sub-model stays plain replicated tensors
            (no FSDP, no cast); a trainable one is replicated with FSDP over a
            (world, 1) mesh so its gradients are still all-reduced.
    """

    shard_size: int | None = None
    reshard_after_forward: bool | None = None
    cpu_offload: bool | None = None
    enabled: bool = True

    @classmethod
    def from_dict(cls, mapping: Mapping[str, Any], where: str = f"{PLAN_KEY}.sub_plans") -> SubPlan:
        """Build from a mapping with the YAML key names; errors name ``where.<key>``."""
        if isinstance(mapping, SubPlan):
            return mapping
        if not isinstance(mapping, Mapping):
            raise ValueError(f"{where}: expected a mapping, got {mapping!r}")
        _check_keys(mapping, cls, where)
        plan = cls(**mapping)
        if plan.shard_size is not None:
            _check_type(plan.shard_size, int, f"{where}.shard_size", "a positive integer or null")
            if plan.shard_size < 1:
                raise ValueError(
                    f"{where}.shard_size: expected a positive integer or null, got {plan.shard_size}"
                )
        if plan.reshard_after_forward is not None:
            _check_type(plan.reshard_after_forward, bool, f"{where}.reshard_after_forward", "bool or null")
        if plan.cpu_offload is not None:
            _check_type(plan.cpu_offload, bool, f"{where}.cpu_offload", "bool or null")
        _check_type(plan.enabled, bool, f"{where}.enabled", "bool")
        return plan


@dataclass
class FSDPPlan:
    """What to shard and how (``parallel.fsdp_plan``); see the README for the pattern syntax.

    Attributes:
        apply_modules: patterns; every matched module becomes an FSDP unit.
        ignored_modules: patterns; parameters of matched modules are never sharded nor cast.
        param_dtype / reduce_dtype / output_dtype / cast_forward_inputs: the
            ``MixedPrecisionPolicy``.
        reshard_after_forward: free gathered parameters after forward.
        cpu_offload: keep sharded parameters and gradients on the host (``CPUOffloadPolicy``).
        num_to_forward_prefetch / num_to_backward_prefetch: explicit prefetch of the next
            N units of the same sub-model; 0 leaves FSDP2's implicit prefetching alone.
        cross_submodel_prefetch: sub-model names in the order the pipeline runs them every
            micro-step (e.g. ``["text_encoder", "predictor"]``): the last unit of each starts the
            all-gather of the next one's first unit (from the second step on: FSDP2 initializes
            a sub-model's communication state in its first forward).
        sub_plans: per top-level sub-model overrides (:class:`SubPlan`).
    """

    apply_modules: list[str] = field(default_factory=list)
    ignored_modules: list[str] = field(default_factory=list)
    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    output_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = True
    reshard_after_forward: bool = True
    cpu_offload: bool = False
    num_to_forward_prefetch: int = 0
    num_to_backward_prefetch: int = 0
    cross_submodel_prefetch: list[str] = field(default_factory=list)
    sub_plans: dict[str, SubPlan] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def from_dict(cls, mapping: Mapping[str, Any] | None, where: str = PLAN_KEY) -> FSDPPlan:
        """Build from the YAML mapping; dtype strings like ``"bf16"`` are parsed; errors name the key."""
        mapping = dict(mapping or {})
        _check_keys(mapping, cls, where)
        for key in ("param_dtype", "reduce_dtype", "output_dtype"):
            if key in mapping:
                mapping[key] = parse_dtype(mapping[key], f"{where}.{key}")
        subs = mapping.get("sub_plans", {})
        if not isinstance(subs, Mapping):
            raise ValueError(
                f"{where}.sub_plans: expected a mapping of sub-model name -> sub-plan, got {subs!r}"
            )
        mapping["sub_plans"] = {
            name: SubPlan.from_dict(sub, f"{where}.sub_plans.{name}") for name, sub in subs.items()
        }
        return cls(**mapping)

    def validate(self, where: str = PLAN_KEY) -> None:
        """Check field types; raise ValueError naming the key and the expected value."""
        for key in ("apply_modules", "ignored_modules"):
            value = getattr(self, key)
            if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
                raise ValueError(
                    f"{where}.{key}: expected a list of non-empty pattern strings, got {value!r}"
                )
            for i, pattern in enumerate(value):
                check_pattern(pattern, f"{where}.{key}[{i}]")
            setattr(self, key, list(value))
        for key in ("param_dtype", "reduce_dtype", "output_dtype"):
            setattr(self, key, parse_dtype(getattr(self, key), f"{where}.{key}"))
        _check_type(self.cast_forward_inputs, bool, f"{where}.cast_forward_inputs", "bool")
        _check_type(self.reshard_after_forward, bool, f"{where}.reshard_after_forward", "bool")
        _check_type(self.cpu_offload, bool, f"{where}.cpu_offload", "bool")
        for key in ("num_to_forward_prefetch", "num_to_backward_prefetch"):
            value = getattr(self, key)
            _check_type(value, int, f"{where}.{key}", "an integer >= 0")
            if value < 0:
                raise ValueError(f"{where}.{key}: expected an integer >= 0, got {value}")
        order = self.cross_submodel_prefetch
        if not isinstance(order, list) or not all(isinstance(n, str) and n for n in order):
            raise ValueError(
                f"{where}.cross_submodel_prefetch: expected a list of sub-model names, got {order!r}"
            )
        if len(set(order)) != len(order):
            raise ValueError(f"{where}.cross_submodel_prefetch: {order} names a sub-model twice")
        self.cross_submodel_prefetch = list(order)
        self.sub_plans = {
            name: SubPlan.from_dict(sub, f"{where}.sub_plans.{name}") for name, sub in self.sub_plans.items()
        }

    def sub_plan(self, owner: str) -> SubPlan:
        """The sub-plan of a top-level sub-model (an all-inherit default when none is declared)."""
        return self.sub_plans.get(owner) or SubPlan()

    def effective_reshard(self, owner: str) -> bool:
        """``reshard_after_forward`` for units of ``owner`` after applying its sub-plan."""
        sub = self.sub_plan(owner)
        return self.reshard_after_forward if sub.reshard_after_forward is None else sub.reshard_after_forward

    def effective_cpu_offload(self, owner: str) -> bool:
        """``cpu_offload`` for units of ``owner`` after applying its sub-plan."""
        sub = self.sub_plan(owner)
        return self.cpu_offload if sub.cpu_offload is None else sub.cpu_offload
