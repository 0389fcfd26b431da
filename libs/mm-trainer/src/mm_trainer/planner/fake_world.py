"""A process that believes it is rank 0 of ``world_size``: torch's fake process group + ``FakeTensorMode``.

torch's ``fake`` backend (``FakeStore`` from ``torch.testing._internal.distributed.fake_pg``, what
torch's own ``FSDPMemTracker`` tests use) answers every collective at once without moving data, so
``DeviceMesh``, ``fully_shard`` and the context-parallel groups of any world size are built in one
process; ``FakeTensorMode`` gives every tensor shapes, dtypes and storages of the right size and no
data. Together they run the trainer's own build and step at real size with nothing allocated.

Process-wide state that planning changes is put back on exit: the process group, the ring kernel
chosen for the CPU (the planner traces on ``cpu_flash``), DTensor's shape propagation, which gets a
fake mode of its own while inside (its global-shape tensors are not allocations of the run), and
the size up to which fake tensors keep their values (small random draws, made for real by the
tracker, keep theirs through the pipeline's index arithmetic).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist
import torch.distributed.tensor._sharding_prop as sharding_prop
from mm_parallel import attention_choice
from torch._subclasses import fake_tensor
from torch._subclasses.fake_tensor import FakeTensorMode
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
    sharding_prop.detect_fake_mode = lambda *args: None  # propagation: FakeTensorMode() of its own
    fake_tensor.CONSTANT_NUMEL_LIMIT = CONSTANT_VALUES
    try:
        yield FakeTensorMode(allow_non_fake_inputs=True)
    finally:
        fake_tensor.CONSTANT_NUMEL_LIMIT = limit
        sharding_prop.detect_fake_mode = detect
        attention_choice._CHOSEN.clear()
        attention_choice._CHOSEN.update(chosen)
        dist.destroy_process_group()
