"""Process-group helpers (work with and without torch.distributed) and rank-0 progress bars."""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch.distributed as dist

T = TypeVar("T")


@contextlib.contextmanager
def single_process_quiet() -> Iterator[None]:
    """Silence torch DCP's "assuming the intent is to load in a single process" warning: a single
    process is what ``no_dist=True`` says, on purpose."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="torch.distributed is disabled, unavailable or uninitialized"
        )
        yield


def is_distributed() -> bool:
    """True when a default process group is initialized."""
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    """Global rank, 0 without a process group."""
    return dist.get_rank() if is_distributed() else 0


def get_world_size() -> int:
    """World size, 1 without a process group."""
    return dist.get_world_size() if is_distributed() else 1


def barrier() -> None:
    """Barrier over the default group; a no-op without one."""
    if is_distributed():
        dist.barrier()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Return rank ``src``'s ``obj`` on every rank (identity without a process group)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def on_rank0(fn: Callable[[], T]) -> T:
    """``fn()`` run on rank 0 only, its result returned on every rank; an exception it raises is raised
    on every rank (so that no rank waits in a collective for a rank that failed)."""
    outcome: tuple[bool, Any] = (True, None)
    if get_rank() == 0:
        try:
            outcome = (True, fn())
        except Exception as exc:  # noqa: BLE001 - re-raised below, on every rank
            outcome = (False, exc)
    ok, value = broadcast_object(outcome)
    if not ok:
        raise value
    return value


def progress(iterable: Iterable[T], *, desc: str, total: int | None = None, unit: str = "it") -> Iterator[T]:
    """Wrap ``iterable`` in a tqdm bar shown only on rank 0 and only when stderr is a terminal."""
    enabled = get_rank() == 0 and sys.stderr.isatty()
    if not enabled:
        yield from iterable
        return
    from tqdm.auto import tqdm

    yield from tqdm(iterable, desc=desc, total=total, unit=unit, dynamic_ncols=True)
