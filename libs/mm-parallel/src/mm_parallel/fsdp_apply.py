"""apply_fsdp_plan: wrap a model with FSDP2 ``fully_shard`` following an :class:`FSDPPlan`."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from mm_parallel.fsdp_plan import FSDPPlan
from mm_parallel.parallel_state import ParallelState
from mm_parallel.prefetch import (
    cross_submodel_pairs,
    install_cross_submodel_prefetch,
    prefetch_lists,
    set_prefetch,
)
from mm_parallel.sub_plans import mesh_for_owner, reshard_after_each_forward
from mm_parallel.unit_layout import UnitSpec, plan_units


@dataclass
class FSDPUnit:
    """One applied FSDP unit, as recorded in :class:`FSDPPlanReport`."""

    path: str
    owner: str
    kind: str
    mesh_shape: tuple[int, ...]
    reshard_after_forward: bool | None
    num_params: int
    numel: int


@dataclass
class FSDPPlanReport:
    """What :func:`apply_fsdp_plan` did.

    Attributes:
        units: FSDP units in wrap order (children before parents).
        matches: apply_modules pattern -> matched module paths.
        ignored_params: parameter names kept out of FSDP (plain tensors, original dtype).
        replicated_params: other parameters left unwrapped (``enabled: false`` frozen
            sub-models, parameters held directly by a container).
        forward_prefetch / backward_prefetch: unit path -> prefetched unit paths.
        cross_submodel_prefetch: last unit of a sub-model -> first unit of the next one it
            prefetches (``cross_submodel_prefetch`` of the plan; active from the second step).
        resharded_roots: frozen sub-model roots given a post-forward reshard hook.
    """

    units: list[FSDPUnit]
    matches: dict[str, list[str]]
    ignored_params: list[str]
    replicated_params: list[str]
    forward_prefetch: dict[str, list[str]] = field(default_factory=dict)
    backward_prefetch: dict[str, list[str]] = field(default_factory=dict)
    cross_submodel_prefetch: dict[str, str] = field(default_factory=dict)
    resharded_roots: list[str] = field(default_factory=list)

    @property
    def unit_paths(self) -> list[str]:
        return [u.path for u in self.units]


def _offload_policy(enabled: bool, device_type: str) -> OffloadPolicy:
    return CPUOffloadPolicy(pin_memory=device_type != "cpu") if enabled else OffloadPolicy()


def _reshard_arg(plan: FSDPPlan, unit: UnitSpec, frozen: bool) -> bool | None:
    """Value passed to fully_shard: a trainable sub-model root keeps FSDP's automatic choice
    (no reshard after forward, backward needs the parameters at once)."""
    value = plan.effective_reshard(unit.owner)
    if unit.is_owner_root and not frozen and value is True:
        return None
    return value


def apply_fsdp_plan(model: nn.Module, plan: FSDPPlan, parallel_state: ParallelState) -> FSDPPlanReport:
    """Shard ``model`` in place with ``fully_shard`` per the plan and return a report.

    Order: ignored_modules are excluded at parameter level (never sharded, never
    cast); modules matched by apply_modules are wrapped in post-order (children
    first); each top-level sub-model of a container is then wrapped itself (its
    leftover parameters, and its FSDP root); a model that is not a container is
    wrapped at the root. Every rank must call this with the same model and plan.
    Works on meta-device models (materialize with ``to_empty`` afterwards).
    """
    layout = plan_units(model, plan)
    cross = cross_submodel_pairs(layout.units, model, plan.cross_submodel_prefetch)  # checked before wrapping
    modules = dict(model.named_modules())
    params = dict(model.named_parameters())
    mp_policy = MixedPrecisionPolicy(
        param_dtype=plan.param_dtype,
        reduce_dtype=plan.reduce_dtype,
        output_dtype=plan.output_dtype,
        cast_forward_inputs=plan.cast_forward_inputs,
    )
    report = FSDPPlanReport(
        units=[],
        matches=layout.matches,
        ignored_params=layout.ignored_params,
        replicated_params=layout.replicated_params,
    )
    meshes = {
        owner: mesh_for_owner(plan, owner, parallel_state)
        for owner in dict.fromkeys(u.owner for u in layout.units)
    }
    for unit in layout.units:
        module = modules[unit.path]
        frozen = unit.owner in layout.frozen_owners
        reshard = _reshard_arg(plan, unit, frozen)
        prefix = f"{unit.path}." if unit.path else ""
        own_ignored = {params[n] for n in layout.ignored_params if n.startswith(prefix)}
        fully_shard(
            module,
            mesh=meshes[unit.owner],
            reshard_after_forward=reshard,
            mp_policy=mp_policy,
            offload_policy=_offload_policy(
                plan.effective_cpu_offload(unit.owner), parallel_state.device_type
            ),
            ignored_params=own_ignored or None,
        )
        if unit.is_owner_root and frozen and plan.effective_reshard(unit.owner) is True:
            reshard_after_each_forward(module)  # type: ignore[arg-type]
            report.resharded_roots.append(unit.path)
        report.units.append(
            FSDPUnit(
                path=unit.path,
                owner=unit.owner,
                kind=unit.kind,
                mesh_shape=tuple(meshes[unit.owner].shape),
                reshard_after_forward=reshard,
                num_params=len(unit.param_names),
                numel=sum(params[n].numel() for n in unit.param_names),
            )
        )
    report.forward_prefetch, report.backward_prefetch = prefetch_lists(
        layout.units, model, plan.num_to_forward_prefetch, plan.num_to_backward_prefetch
    )
    set_prefetch(model, report.forward_prefetch, report.backward_prefetch)
    report.cross_submodel_prefetch = cross
    install_cross_submodel_prefetch(model, cross, report.forward_prefetch)
    return report
