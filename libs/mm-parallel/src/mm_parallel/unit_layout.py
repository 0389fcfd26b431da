"""Pure planning step shared by ``apply_fsdp_plan`` and ``explain_fsdp_plan``.

Turns (model, plan) into the list of FSDP units in wrap order without touching
parameters or process groups, so it also works on a meta-device model.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from torch import nn

from mm_parallel.fsdp_plan import PLAN_KEY, FSDPPlan
from mm_parallel.patterns import match_modules

SKIP_ROOT_WRAP_ATTR = "_fsdp_skip_root_wrap"
"""Class attribute a container sets to True: its direct children are the sub-models and
the container itself is never wrapped by ``fully_shard``."""

UnitKind = Literal["pattern", "fallback", "root"]


@dataclass
class UnitSpec:
    """One planned FSDP unit.

    Attributes:
        path: dotted module path ("" = the model itself).
        owner: top-level sub-model name ("" for a model that is not a container).
        kind: ``pattern`` (matched by apply_modules), ``fallback`` (a container's
            sub-model wrapped for its leftover parameters; the FSDP root of that
            sub-model) or ``root`` (the whole model, for non-containers).
        param_names: fully qualified names of the parameters this unit manages.
    """

    path: str
    owner: str
    kind: UnitKind
    param_names: list[str] = field(default_factory=list)

    @property
    def is_owner_root(self) -> bool:
        """True for the outermost unit of its sub-model (the FSDP root of that sub-model)."""
        return self.path == self.owner


@dataclass
class UnitLayout:
    """Planned units (wrap order: children before parents) and the parameters outside them."""

    units: list[UnitSpec]
    matches: dict[str, list[str]]
    ignored_matches: dict[str, list[str]]
    ignored_params: list[str]
    replicated_params: list[str]
    unmatched: list[str]
    is_container: bool
    frozen_owners: set[str]


def is_container(model: nn.Module) -> bool:
    """True when the model opts out of the root wrap (``_fsdp_skip_root_wrap = True``)."""
    return getattr(model, SKIP_ROOT_WRAP_ATTR, False) is True


def owner_of(path: str, container: bool) -> str:
    """Top-level sub-model a module path belongs to."""
    return path.split(".", 1)[0] if container else ""


def _post_order(module: nn.Module, prefix: str = "") -> Iterator[str]:
    for name, child in module.named_children():
        yield from _post_order(child, f"{prefix}{name}" if not prefix else f"{prefix}.{name}")
    yield prefix


def _inside(path: str, ancestor: str) -> bool:
    return ancestor == "" or path == ancestor or path.startswith(ancestor + ".")


def _check_sub_plans(model: nn.Module, plan: FSDPPlan, container: bool) -> None:
    if not plan.sub_plans:
        return
    if not container:
        raise ValueError(
            f"{PLAN_KEY}.sub_plans: {type(model).__name__} is not a container "
            f"({SKIP_ROOT_WRAP_ATTR} is not True), so it has no sub-models to plan separately"
        )
    children = [name for name, _ in model.named_children()]
    for name in plan.sub_plans:
        if name not in children:
            close = difflib.get_close_matches(name, children, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; sub-models: {children}"
            raise ValueError(
                f"{PLAN_KEY}.sub_plans: {name!r} is not a sub-model of {type(model).__name__}{hint}"
            )


def plan_units(model: nn.Module, plan: FSDPPlan, *, strict: bool = True) -> UnitLayout:
    """Resolve ``plan`` against ``model``: units in wrap order and parameter ownership.

    With ``strict`` a pattern matching nothing raises (naming the closest paths);
    otherwise it is listed in ``unmatched``.
    """
    container = is_container(model)
    _check_sub_plans(model, plan, container)
    matches = match_modules(model, plan.apply_modules, strict=strict, what=f"{PLAN_KEY}.apply_modules")
    ignored_matches = match_modules(
        model, plan.ignored_modules, strict=strict, what=f"{PLAN_KEY}.ignored_modules"
    )
    unmatched = [p for p, hits in {**matches, **ignored_matches}.items() if not hits]
    ignored_roots = sorted({path for hits in ignored_matches.values() for path in hits})
    params = dict(model.named_parameters())
    ignored = {n for n in params if any(_inside(n, root) for root in ignored_roots)}
    owners = [name for name, _ in model.named_children()] if container else [""]
    frozen = {o for o in owners if not any(p.requires_grad for n, p in params.items() if _inside(n, o))}
    replicated = {o for o in owners if o and not plan.sub_plan(o).enabled and o in frozen}

    wanted = {path for hits in matches.values() for path in hits}
    for path in sorted(wanted):
        clash = next((root for root in ignored_roots if _inside(path, root)), None)
        if clash is not None:
            raise ValueError(
                f"{PLAN_KEY}: module {path!r} is matched by apply_modules but lies inside "
                f"ignored module {clash!r}; remove it from one of the two lists"
            )
    units: list[UnitSpec] = []
    for path in _post_order(model):
        owner = owner_of(path, container)
        if owner in replicated:
            continue
        is_pattern = path in wanted
        is_fallback = container and path in owners and not is_pattern
        is_root = not container and path == ""
        if not (is_pattern or is_fallback or is_root):
            continue
        has_params = any(_inside(n, path) and n not in ignored for n in params)
        if is_pattern or has_params:
            kind: UnitKind = "pattern" if is_pattern else ("root" if is_root else "fallback")
            units.append(UnitSpec(path=path, owner=owner, kind=kind))

    replicated_params: list[str] = []
    for name in params:
        if name in ignored:
            continue
        holders = [u for u in units if _inside(name, u.path)]
        if holders:
            max(holders, key=lambda u: len(u.path)).param_names.append(name)
        else:
            replicated_params.append(name)
    return UnitLayout(
        units=units,
        matches=matches,
        ignored_matches=ignored_matches,
        ignored_params=sorted(ignored),
        replicated_params=replicated_params,
        unmatched=unmatched,
        is_container=container,
        frozen_owners=frozen,
    )
