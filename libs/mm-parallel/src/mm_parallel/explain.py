"""explain_fsdp_plan: what a plan would do to a model, without a process group.

Works on a meta-device model: only shapes and dtypes are read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from mm_parallel.fsdp_plan import FSDPPlan
from mm_parallel.sub_plans import shard_size_for_owner
from mm_parallel.text_table import text_table
from mm_parallel.unit_layout import plan_units


@dataclass
class UnitExplanation:
    """One planned unit with its memory under the plan's dtypes.

    ``sharded_bytes`` is this rank's resident share (original dtype, dim-0 padded as
    FSDP2 pads); ``unsharded_bytes`` is the all-gathered size during compute
    (``param_dtype`` when set).
    """

    path: str
    owner: str
    kind: str
    shard_size: int
    num_params: int
    numel: int
    sharded_bytes: int
    unsharded_bytes: int


@dataclass
class FSDPPlanExplanation:
    """Result of :func:`explain_fsdp_plan`; ``str()`` renders a text table."""

    world_size: int
    units: list[UnitExplanation]
    ignored_params: list[str]
    ignored_bytes: int
    replicated_params: list[str]
    replicated_bytes: int
    unmatched_patterns: list[str]
    matches: dict[str, list[str]] = field(default_factory=dict)

    @property
    def peak_param_bytes(self) -> int:
        """Estimated peak parameter memory per rank: every sharded share, the
        unsharded (ignored / replicated) parameters, and the two largest units gathered."""
        largest = sorted((u.unsharded_bytes for u in self.units), reverse=True)[:2]
        resident = sum(u.sharded_bytes for u in self.units)
        return resident + self.ignored_bytes + self.replicated_bytes + sum(largest)

    def sharded_bytes_by_owner(self) -> dict[str, int]:
        """Resident (sharded) parameter bytes per rank of each top-level sub-model."""
        out: dict[str, int] = {}
        for u in self.units:
            out[u.owner] = out.get(u.owner, 0) + u.sharded_bytes
        return out

    def table(self) -> str:
        """A fixed-width text table of the units followed by the summary lines."""
        header = ("unit", "owner", "kind", "shard", "params", "numel", "per rank", "gathered")
        rows = [
            (
                u.path or "<root>",
                u.owner or "-",
                u.kind,
                str(u.shard_size),
                str(u.num_params),
                f"{u.numel:,}",
                _size(u.sharded_bytes),
                _size(u.unsharded_bytes),
            )
            for u in self.units
        ]
        lines = [
            text_table(header, rows),
            f"world size: {self.world_size}",
            *(
                f"sharded params per rank, {owner or '<root>'}: {_size(b)}"
                for owner, b in self.sharded_bytes_by_owner().items()
            ),
            f"ignored params: {len(self.ignored_params)} ({_size(self.ignored_bytes)}, never sharded or cast)",
            f"replicated params: {len(self.replicated_params)} ({_size(self.replicated_bytes)}, not wrapped)",
            f"unmatched patterns: {', '.join(self.unmatched_patterns) or 'none'}",
            f"estimated peak parameter memory per rank: {_size(self.peak_param_bytes)}",
        ]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _size(num_bytes: int) -> str:
    """Human-readable byte count (B, KiB, MiB, GiB, TiB)."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _sharded_bytes(param: torch.Tensor, shard_size: int) -> int:
    if param.dim() == 0:
        return param.element_size()
    rows = math.ceil(param.shape[0] / shard_size)
    return rows * math.prod(param.shape[1:]) * param.element_size()


def _gathered_bytes(param: torch.Tensor, param_dtype: torch.dtype | None) -> int:
    size = (
        param_dtype.itemsize
        if param_dtype is not None and param.is_floating_point()
        else param.element_size()
    )
    return param.numel() * size


def explain_fsdp_plan(
    model: nn.Module, plan: FSDPPlan, world_size: int, *, dp_replicate: int = 1
) -> FSDPPlanExplanation:
    """Describe the FSDP units ``plan`` makes of ``model`` at ``world_size`` ranks.

    Unlike :func:`apply_fsdp_plan`, unmatched patterns are reported instead of raised.
    ``dp_replicate`` > 1 describes HSDP (each replica shards over world / dp_replicate).
    """
    layout = plan_units(model, plan, strict=False)
    params = dict(model.named_parameters())
    units = []
    for unit in layout.units:
        shard = shard_size_for_owner(plan, unit.owner, world_size, dp_replicate)
        owned = [params[n] for n in unit.param_names]
        units.append(
            UnitExplanation(
                path=unit.path,
                owner=unit.owner,
                kind=unit.kind,
                shard_size=shard,
                num_params=len(owned),
                numel=sum(p.numel() for p in owned),
                sharded_bytes=sum(_sharded_bytes(p, shard) for p in owned),
                unsharded_bytes=sum(_gathered_bytes(p, plan.param_dtype) for p in owned),
            )
        )
    return FSDPPlanExplanation(
        world_size=world_size,
        units=units,
        ignored_params=layout.ignored_params,
        ignored_bytes=sum(params[n].numel() * params[n].element_size() for n in layout.ignored_params),
        replicated_params=layout.replicated_params,
        replicated_bytes=sum(params[n].numel() * params[n].element_size() for n in layout.replicated_params),
        unmatched_patterns=layout.unmatched,
        matches=layout.matches,
    )
