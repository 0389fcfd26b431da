"""A process that believes it is rank 0 of ``world_size``: torch's fake process group + ``FakeTensorMode``.

torch's ``fake`` backend (``FakeStore`` from ``torch.testing._internal.distributed.fake_pg``, what
torch's own ``FSDPMemTracker`` tests use) answers every collective at once without moving data, so
``DeviceMesh``, ``fully_shard`` and the context-parallel groups of any world size are built in one
process; ``FakeTensorMode`` gives every tensor shapes, dtypes and storages of the right size and no
data. Together they run the trainer's own build and step at real size with nothing allocated.

Process-wide state that planning changes is put back on exit: the process group, the ring kernel
chosen for the CPU (the planner traces on ``cpu_flash``), DTensor's shape propagation, which gets a
fake mode of its own while inside (its global-shape tensors are not allocations of the run) and
a linear scan for strided shards (:func:`_strided_flag_once`), the size up to which fake
tensors keep their values (small random draws, made for real by the
tracker, keep theirs through the pipeline's index arithmetic), and DTensor's sharding caches
(:func:`forget_sharding_decisions`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.tensor._redistribute as redistribute
import torch.distributed.tensor._sharding_prop as sharding_prop
from mm_parallel import attention_choice
from torch._subclasses import fake_tensor
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore

CONSTANT_VALUES = 1 << 16
"""Tensors up to this many elements keep their values through ops on values (``FakeTensorMode``'s
constant propagation; torch's default is 1): the planner's real random draws flow into index checks."""


class PlanningError(RuntimeError):
    """The planner cannot run here (a process group already exists)."""


@contextmanager
def fake_world(world_size: int, rank: int = 0) -> Iterator[FakeTensorMode]:
    """Inside: a fake default process group of ``world_size`` (this process is ``rank``); yields the
    ``FakeTensorMode`` to build and trace in (real tensors mixed in are converted, not refused)."""
    if dist.is_initialized():
        raise PlanningError(
            "mm-train plan runs in a process of its own: a process group already exists here "
            f"(world size {dist.get_world_size()}); run `mm-train plan` as a separate command"
        )
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    chosen = dict(attention_choice._CHOSEN)
    detect, limit = sharding_prop.detect_fake_mode, fake_tensor.CONSTANT_NUMEL_LIMIT
    propagation = FakeTensorMode()  # DTensor's shape inference: a fake mode of its own, made once
    sharding_prop.detect_fake_mode = lambda *args: propagation
    strided = sharding_prop._propagate_use_strided_shard_flag
    sharding_prop._propagate_use_strided_shard_flag = _strided_flag_once(strided)
    fake_tensor.CONSTANT_NUMEL_LIMIT = CONSTANT_VALUES
    try:
        yield FakeTensorMode(allow_non_fake_inputs=True)
    finally:
        fake_tensor.CONSTANT_NUMEL_LIMIT = limit
        sharding_prop._propagate_use_strided_shard_flag = strided
        sharding_prop.detect_fake_mode = detect
        attention_choice._CHOSEN.clear()
        attention_choice._CHOSEN.update(chosen)
        forget_sharding_decisions()
        dist.destroy_process_group()


def forget_sharding_decisions() -> None:
    """Empty DTensor's caches of sharding decisions (torch's native one and its Python ones).

    They are keyed by op schema, whose meshes compare by value (ranks, shape, names), not by this
    process's place in them; a cached output spec carries the mesh it was first computed on. After a
    fake world of rank 0, a real rank 1 in the same process (or forked from it) got the fake mesh back
    for a sharded bias: its coordinate 0, so the bias claimed rank 0's shard in a checkpoint.
    """
    torch._C._clear_DTensor_sharding_propagator_cache()
    propagator = DTensor._op_dispatcher.sharding_propagator
    propagator.propagate_op_sharding.cache_clear()
    propagator._propagate_tensor_meta_cached.cache_clear()
    redistribute._gen_transform_infos.cache_clear()


def _strided_flag_once(original: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    """torch 2.13's ``_propagate_use_strided_shard_flag`` scans every input spec once per output
    strategy: quadratic in the list length of a foreach op (the fused AdamW step over an LTX-2's 3,510
    parameters: minutes of CPU on fake tensors; a real run pays it once, then hits the sharding
    cache). It changes nothing unless an input spec has a ``_StridedShard`` placement: that scan is
    made once per op schema here, and the original runs only where it finds one."""
    has_strided: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def propagate(op_strategy: Any, op_schema: Any) -> None:
        if op_schema not in has_strided:
            has_strided[op_schema] = any(
                isinstance(p, sharding_prop._StridedShard)
                for spec in op_schema.args_spec
                for p in spec.placements
            )
        if has_strided[op_schema]:
            original(op_strategy, op_schema)

    return propagate
