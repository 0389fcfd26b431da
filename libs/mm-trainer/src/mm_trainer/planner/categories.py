"""The memory categories of a plan: what the tracker tags each storage with, and the report's lines.

Every storage the traced step allocates gets one tag (:class:`Tag`, a string enum whose values are
those of torch's ``FSDPMemTracker``, so its own tagging lands in the same slots, plus the planner's
``EMA``, ``Communication``, ``Attention workspace`` and host tags). The report groups tags into
:data:`DEVICE_CATEGORIES` (per-rank device memory at the peak) and :data:`HOST_CATEGORIES` (host
memory of the rank: CPU-offloaded state).

Adding a category (e.g. the host copy an asynchronous checkpoint stages) is data, not code in the
tracker: append a :class:`Category` to :data:`HOST_CATEGORIES` (or the device list) and, when the
bytes are not traced storages but a function of the built run, register a
:func:`register_host_term` that computes them from the :class:`~mm_trainer.planner.trace.TracedRun`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Tag(str, Enum):
    """What one traced storage is (values match torch ``_FSDPRefType`` / ``_MemRefType`` where shared)."""

    SHARDED_PARAM = "Sharded Param"
    UNSHARDED_PARAM = "Unsharded Param"
    PARAM = "Parameter"
    BUFFER = "Buffer"
    SHARDED_GRAD = "Sharded Grad"
    UNSHARDED_GRAD = "Unsharded Grad"
    GRAD = "Gradient"
    ACT = "Activation"
    INP = "Inputs"
    TEMP = "Temp"
    OPT = "OptState"
    ALL_GATHER = "All Gather"
    REDUCE_SCATTER = "Reduce Scatter"
    COMM = "Communication"
    EMA = "EMA"
    ATTENTION = "Attention workspace"
    OTHER = "Other"
    HOST_ACT = "Host Activation"


HOST_TAGS = frozenset({Tag.HOST_ACT})
"""Tags of storages that live in host memory whatever the layout (never part of the device peak)."""

OFFLOADABLE = (Tag.SHARDED_PARAM, Tag.SHARDED_GRAD, Tag.OPT, Tag.EMA)
"""What FSDP's CPU offload (``CPUOffloadPolicy``) keeps on the host for the units it applies to:
the sharded parameters and gradients, and so the optimizer states and the EMA that live beside them."""


@dataclass(frozen=True)
class Category:
    """One line of the report: a name, the tags it sums, and what the line says about them."""

    name: str
    tags: tuple[Tag, ...]
    note: str = ""


DEVICE_CATEGORIES: list[Category] = [
    Category("parameters", (Tag.SHARDED_PARAM, Tag.UNSHARDED_PARAM, Tag.PARAM, Tag.BUFFER),
             "sharded + gathered units + unsharded (ignored / not wrapped) + buffers"),
    Category("gradients", (Tag.SHARDED_GRAD, Tag.UNSHARDED_GRAD, Tag.GRAD), "sharded + unsharded (before reduce-scatter; kept whole between micro-steps without gradient sync)"),
    Category("optimizer states", (Tag.OPT,), "AdamW exp_avg + exp_avg_sq + step (+ its temporaries while it steps)"),
    Category("EMA", (Tag.EMA,), "training.ema, fp32 on the shards"),
    Category("activations", (Tag.ACT, Tag.INP), "kept for backward, forward outputs, the batch"),
    Category("temporaries", (Tag.TEMP, Tag.OTHER), "backward intermediates, activation gradients"),
    Category("attention kernel workspace", (Tag.ATTENTION,),
             "not traced: the target kernel's memory model (mm_parallel.attention_memory)"),
    Category("communication buffers", (Tag.ALL_GATHER, Tag.REDUCE_SCATTER, Tag.COMM),
             "FSDP all-gather / reduce-scatter, all-to-all, ring send/recv"),
]  # fmt: skip
"""The per-rank device memory lines, in report order."""

HOST_CATEGORIES: list[Category] = [
    Category("offloaded parameters, gradients, optimizer states, EMA", OFFLOADABLE,
             "parallel.fsdp_plan.cpu_offload: their host share"),
    Category("offloaded activations", (Tag.HOST_ACT,), "features.activation_offload_plan"),
]  # fmt: skip
"""The per-rank host memory lines (the offloadable tags count here with the layout's host share)."""

HostTerm = Callable[[Any], tuple[str, int, str] | None]
HOST_TERMS: list[HostTerm] = []
"""Functions ``(traced run) -> (name, bytes, note) | None`` adding host lines that are not traced
storages (a later change adds, e.g., the staging copy of asynchronous checkpoint saves)."""


def register_host_term(term: HostTerm) -> HostTerm:
    """Add a host-memory line computed from the traced run (usable as a decorator)."""
    HOST_TERMS.append(term)
    return term


def sum_tags(snapshot: dict[Any, int], tags: tuple[Tag, ...]) -> int:
    """Bytes of ``tags`` in a tracker snapshot (keys are tags or their string values)."""
    return sum(int(snapshot.get(tag, 0)) for tag in tags)
