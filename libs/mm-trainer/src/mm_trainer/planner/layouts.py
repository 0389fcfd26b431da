"""Layouts that differ from a traced one only in how the per-rank state is sharded or where it lives.

A trace at one layout gives the memory of every tag over time. Two layout changes leave the step's
computation, its activations and FSDP's gathered units untouched and change only the per-rank state
(sharded parameters and gradients, optimizer states, EMA):

- the HSDP replicate size (``parallel.replicate_parallel_size``): the FSDP shard group becomes
  ``world / replicate`` ranks, so each rank holds ``ceil(rows / shard)`` rows of every sharded tensor;
- CPU offload (``parallel.fsdp_plan.cpu_offload``): that state moves to the host.

:func:`layout_view` turns such a change into a :class:`~mm_trainer.planner.tracker.View`: per tag,
the exact ratio of the new per-rank bytes to the traced ones, computed parameter by parameter from
the global shapes (FSDP2 pads dim 0 to a multiple of the shard size), split into device and host.
The tracker applies it at every point of the trace, so the view's peak is the peak of the new
layout (partially accumulated gradients scale like their parameters). A sub-model with its own
``sub_plans.<name>.shard_size`` keeps it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mm_config import TrainConfig
from torch import nn
from torch.distributed.tensor import DTensor

from mm_trainer.planner.categories import Tag
from mm_trainer.planner.tracker import View

CONFIGURED = "as configured"


@dataclass(frozen=True)
class ParamShard:
    """One parameter's sharding facts: global shape, element size, and where its state lives."""

    shape: tuple[int, ...]
    itemsize: int
    trainable: bool
    fsdp: bool
    fixed_shard: int | None
    """A sub-plan's own shard size (or 1 for a sub-model not sharded); None follows the layout."""
    owner_offload: bool | None
    """A sub-plan's own ``cpu_offload``; None follows the plan."""
    traced_shard: int
    traced_offload: bool

    def local_numel(self, shard: int) -> int:
        if not self.shape:
            return 1
        return math.ceil(self.shape[0] / shard) * math.prod(self.shape[1:])


def param_shards(model: nn.Module, config: TrainConfig, traced_shard: int) -> list[ParamShard]:
    """The sharding facts of every parameter of a built (sharded) model of ``config``."""
    plan = config.parallel.fsdp_plan
    out = []
    for name, param in model.named_parameters():
        owner = name.split(".", 1)[0]
        sub = plan.sub_plans.get(owner)
        fixed = None
        if sub is not None and not sub.enabled:
            fixed = 1
        elif sub is not None and sub.shard_size is not None:
            fixed = sub.shard_size
        offload = None if sub is None else sub.cpu_offload
        fsdp = isinstance(param, DTensor)
        traced = (fixed or traced_shard) if fsdp else 1
        out.append(
            ParamShard(
                shape=tuple(param.shape), itemsize=param.element_size(), trainable=param.requires_grad,
                fsdp=fsdp, fixed_shard=fixed, owner_offload=offload, traced_shard=traced,
                traced_offload=fsdp and (plan.cpu_offload if offload is None else offload),
            )
        )  # fmt: skip
    return out


def layout_view(
    name: str, shards: list[ParamShard], *, default_shard: int, cpu_offload: bool, traced: bool = False
) -> View:
    """The view of a layout whose FSDP shard group is ``default_shard`` ranks and whose plan-level
    ``cpu_offload`` is as given (``traced``: the traced layout itself, only split device / host)."""
    totals: dict[Tag, list[float]] = {}  # tag -> [traced bytes, new device bytes, new host bytes]

    def add(tag: Tag, traced_bytes: float, new_bytes: float, host: bool) -> None:
        entry = totals.setdefault(tag, [0.0, 0.0, 0.0])
        entry[0] += traced_bytes
        entry[2 if host else 1] += new_bytes

    for p in shards:
        shard = p.traced_shard if traced or not p.fsdp else (p.fixed_shard or default_shard)
        offload = p.fsdp and (cpu_offload if p.owner_offload is None else p.owner_offload)
        if traced:
            offload = p.traced_offload
        old, new = p.local_numel(p.traced_shard), p.local_numel(shard)
        if p.fsdp:
            add(Tag.SHARDED_PARAM, old * p.itemsize, new * p.itemsize, offload)
        if p.trainable:
            if p.fsdp:
                add(Tag.SHARDED_GRAD, old * p.itemsize, new * p.itemsize, offload)
            add(Tag.OPT, 2 * old * p.itemsize, 2 * new * p.itemsize, offload)
            add(Tag.EMA, 4 * old, 4 * new, offload)
    device = {tag: new_dev / old for tag, (old, new_dev, _) in totals.items() if old}
    host = {tag: new_host / old for tag, (old, _, new_host) in totals.items() if old}
    return View(
        name, device, host, shard=0 if traced else default_shard, offload=None if traced else cpu_offload
    )


def static_bytes(shards: list[ParamShard], *, ema: bool) -> dict[str, int]:
    """Per-rank bytes of the traced layout's state (for the report's check against the trace)."""
    params = sum(p.local_numel(p.traced_shard) * p.itemsize for p in shards)
    trainable = [p for p in shards if p.trainable]
    grads = sum(p.local_numel(p.traced_shard) * p.itemsize for p in trainable)
    return {
        "parameters": params,
        "gradients": grads,
        "optimizer states": 2 * grads,
        "EMA": 4 * sum(p.local_numel(p.traced_shard) for p in trainable) if ema else 0,
    }
