"""Step time from the traced ops: a roofline per op and a bandwidth model per collective.

Compute: each op takes ``max(FLOPs / peak, bytes / HBM bandwidth)`` on the target device (the
roofline torch's ``RuntimeEstimator`` uses; torch's own FLOP formulas, ``torch.utils.flop_counter``;
bytes = what the op reads and writes, broadcast dimensions counted once; views and metadata queries
move nothing).
Peaks are the table's dense ones (:mod:`mm_trainer.planner.device_specs`): a real kernel reaches some
fraction of them, so the estimate is a lower bound on step time and an upper bound on MFU.

Communication: a collective moves ``size x (n-1)/n`` bytes per rank (all-gather, reduce-scatter,
all-to-all; twice for an all-reduce; a point-to-point send its size) over the slowest link of its
group: inside a node the NVLink / HCCS figure, across nodes the network's (``ranks_per_node``).
Torch's ``fake_collectives`` names the group and buffer of every collective op.

How the parts add up (:meth:`StepCost.step_seconds`): FSDP's all-gathers and reduce-scatters (and
HSDP's all-reduce) run on their own streams, prefetched, so only what exceeds the compute is
exposed; ring attention's point-to-point exchange overlaps its block kernels, so only what exceeds
the attention compute is exposed; Ulysses' all-to-all is on the critical path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed._tools.fake_collectives import CollectiveOp, collective_ops
from torch.utils.flop_counter import flop_registry

from mm_trainer.planner.device_specs import DeviceSpec

c10d = torch.ops.c10d
funcol = torch.ops._c10d_functional  # the functional collectives (mm-parallel's Ulysses all-to-all)
_FACTOR = {  # bytes on the wire per rank, as a multiple of size x (n-1)/n (ring algorithms)
    c10d._allgather_base_.default: 1.0,
    c10d.allgather_.default: 1.0,
    c10d._reduce_scatter_base_.default: 1.0,
    c10d.reduce_scatter_.default: 1.0,
    c10d.alltoall_base_.default: 1.0,
    c10d.alltoall_.default: 1.0,
    funcol.all_to_all_single.default: 0.5,  # torch's size of it counts its input and its result
    c10d.allreduce_.default: 2.0,
}
_P2P = {c10d.send.default: 1.0, c10d.broadcast_.default: 1.0}
BACKWARD_GATHER = "all-gather (backward)"
FSDP_KINDS = ("all-gather", "reduce-scatter", "all-reduce", BACKWARD_GATHER)


def collective_kind(func: object) -> str | None:
    """A short name for a c10d collective op (None for other ops and for receives)."""
    names = {
        c10d._allgather_base_.default: "all-gather",
        c10d.allgather_.default: "all-gather",
        c10d._reduce_scatter_base_.default: "reduce-scatter",
        c10d.reduce_scatter_.default: "reduce-scatter",
        c10d.allreduce_.default: "all-reduce",
        c10d.alltoall_base_.default: "all-to-all",
        c10d.alltoall_.default: "all-to-all",
        funcol.all_to_all_single.default: "all-to-all",
        c10d.send.default: "send/recv",
        c10d.broadcast_.default: "broadcast",
    }
    return names.get(func)  # type: ignore[call-overload]


def is_collective(func: object) -> bool:
    return func in collective_ops


@dataclass
class StepCost:
    """Seconds and FLOPs accumulated over a traced part of the step (one micro-step, the optimizer)."""

    compute_s: float = 0.0
    attention_s: float = 0.0
    flops: float = 0.0
    recompute_flops: float = 0.0
    comm_s: dict[str, float] = field(default_factory=dict)
    comm_bytes: dict[str, float] = field(default_factory=dict)
    overlapped_s: dict[str, float] = field(default_factory=dict)
    """Seconds of each kind's asynchronous communication that ran behind compute (:mod:`.overlap`)."""

    def add_comm(self, kind: str, nbytes: float, seconds: float) -> None:
        self.comm_s[kind] = self.comm_s.get(kind, 0.0) + seconds
        self.comm_bytes[kind] = self.comm_bytes.get(kind, 0.0) + nbytes

    def exposed_comm_s(self) -> float:
        """Communication time left on the critical path (see the module docstring)."""
        fsdp = sum(self.comm_s.get(k, 0.0) for k in FSDP_KINDS)
        ring = self.comm_s.get("send/recv", 0.0)
        serial = sum(v for k, v in self.comm_s.items() if k not in (*FSDP_KINDS, "send/recv"))
        serial -= sum(v for k, v in self.overlapped_s.items() if k not in (*FSDP_KINDS, "send/recv"))
        return serial + max(0.0, ring - self.attention_s) + max(0.0, fsdp - self.compute_s)

    def step_seconds(self) -> float:
        return self.compute_s + self.exposed_comm_s()

    def scaled(self, factor: float) -> StepCost:
        """This part ``factor`` times over (the untraced micro-steps of an accumulation)."""
        return StepCost(
            self.compute_s * factor, self.attention_s * factor, self.flops * factor,
            self.recompute_flops * factor, {k: v * factor for k, v in self.comm_s.items()},
            {k: v * factor for k, v in self.comm_bytes.items()}, {k: v * factor for k, v in self.overlapped_s.items()},
        )  # fmt: skip

    def __add__(self, other: StepCost) -> StepCost:
        out = self.scaled(1.0)
        out.compute_s += other.compute_s
        out.attention_s += other.attention_s
        out.flops += other.flops
        out.recompute_flops += other.recompute_flops
        for kind, seconds in other.comm_s.items():
            out.add_comm(kind, other.comm_bytes.get(kind, 0.0), seconds)
        for kind, seconds in other.overlapped_s.items():
            out.overlapped_s[kind] = out.overlapped_s.get(kind, 0.0) + seconds
        return out


class CostModel:
    """Per-op seconds on ``device`` (no time for a device without FLOP/s figures: the CPU check)."""

    def __init__(self, device: DeviceSpec, ranks_per_node: int) -> None:
        self.device = device
        self.ranks_per_node = max(1, ranks_per_node)
        self.timed = device.bf16_tflops > 0

    def op_flops(self, func: object, args: tuple, kwargs: dict, out: object) -> int:
        """torch's FLOP count of one aten op (0 when it has no formula)."""
        formula = flop_registry.get(getattr(func, "_overloadpacket", None))
        if formula is None:
            return 0
        return int(formula(*args, **kwargs, out_val=out))

    def op_seconds(self, func: object, flops: int, args: tuple, kwargs: dict, out: object) -> float:
        """Roofline seconds of one aten op."""
        if not self.timed or getattr(func, "is_view", False) or getattr(func, "namespace", "") == "prim":
            return 0.0  # views and metadata queries (``prim.device``) move nothing
        moved = sum(_bytes(t) for t in _tensors((args, kwargs))) + sum(_bytes(t) for t in _tensors(out))
        memory_s = moved / (self.device.hbm_tbps * 1e12)
        if not flops:
            return memory_s
        dtype = next((t.dtype for t in _tensors(args) if t.is_floating_point()), torch.float32)
        return max(flops / self.device.peak_flops(dtype), memory_s)

    def collective(
        self, func: object, args: tuple, kwargs: dict, out: object
    ) -> tuple[str, float, float] | None:
        """``(kind, bytes on the wire per rank, seconds)`` of a collective op; None for receives and
        the ops that move nothing (barriers, waits)."""
        kind = collective_kind(func)
        if kind is None:
            return None
        group = CollectiveOp.get_process_group(func, args)
        size = CollectiveOp.get_comm_tensor_size(func, out, args, kwargs)
        ranks = dist.get_process_group_ranks(group)
        n = len(ranks)
        if n <= 1:
            return kind, 0.0, 0.0
        wire = size * _FACTOR[func] * (n - 1) / n if func in _FACTOR else size * _P2P[func]  # type: ignore[index]
        nodes = {r // self.ranks_per_node for r in ranks}
        gbps = self.device.intra_node_gbps if len(nodes) == 1 else self.device.inter_node_gbps
        seconds = wire / (gbps * 1e9) if self.timed and gbps > 0 else 0.0
        return kind, wire, seconds

    def host_seconds(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` between device and host (CPU offload)."""
        return nbytes / (self.device.host_gbps * 1e9) if self.timed and self.device.host_gbps > 0 else 0.0


def _tensors(tree: object) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []

    def visit(x: object) -> None:
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            for y in x:
                visit(y)
        elif isinstance(x, dict):
            for y in x.values():
                visit(y)

    visit(tree)
    return out


def _bytes(t: torch.Tensor) -> int:
    """Bytes an op reads or writes of ``t``: dimensions of stride 0 (broadcast) count once."""
    numel = math.prod(size for size, stride in zip(t.shape, t.stride()) if stride != 0)
    return numel * t.element_size()
