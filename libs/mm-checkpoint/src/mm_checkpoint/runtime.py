"""Process-group helpers (work with and without torch.distributed) and rank-0 progress bars."""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch.distributed as dist

from .errors import raised_on_every_rank

T = TypeVar("T")

_LONG_WAIT_GROUP: contextvars.ContextVar[Any] = contextvars.ContextVar("long_wait_group", default=None)


@contextlib.contextmanager
def long_waits(group: Any) -> Iterator[None]:
    """Within the block, collectives where ranks wait for one rank's long work (:func:`on_rank0`: hashing
    a weights source; :func:`~mm_checkpoint.stage_on_node`: one rank per node copying) run on ``group``:
    a process group of every rank whose timeout is meant for such waits, so the run's collective timeout
    can stay short. None (and outside the block): the default group."""
    token = _LONG_WAIT_GROUP.set(group)
    try:
        yield
    finally:
        _LONG_WAIT_GROUP.reset(token)


def long_wait_group() -> Any:
    """The group set by :func:`long_waits` (None: the default group)."""
    return _LONG_WAIT_GROUP.get()


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


def broadcast_object(obj: Any, src: int = 0, group: Any = None) -> Any:
    """Return rank ``src``'s ``obj`` on every rank (identity without a process group)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


def on_rank0(fn: Callable[[], T]) -> T:
    """``fn()`` run on rank 0 only, its result returned on every rank; an exception it raises is raised
    on every rank (so that no rank waits in a collective for a rank that failed), marked as such
    (:func:`~mm_checkpoint.errors.raised_on_every_rank`). The others wait on the :func:`long_waits`
    group when one is set."""
    outcome: tuple[bool, Any] = (True, None)
    if get_rank() == 0:
        try:
            outcome = (True, fn())
        except Exception as exc:  # noqa: BLE001 - re-raised below, on every rank
            outcome = (False, exc)
    ok, value = broadcast_object(outcome, group=long_wait_group())
    if not ok:
        raise raised_on_every_rank(value)
    return value


PROGRESS_INTERVAL_S = 10.0
"""Seconds between two progress lines where stderr is no terminal."""


def progress(iterable: Iterable[T], *, desc: str, total: int | None = None, unit: str = "it") -> Iterator[T]:
    """``iterable``, its progress shown on rank 0: a tqdm bar where stderr is a terminal; otherwise (a
    log file, a pipe) a plain line once it has run :data:`PROGRESS_INTERVAL_S` seconds, then every
    :data:`PROGRESS_INTERVAL_S` and at its end (``convert x -> dcp: 120/400 tensor | 8.1 tensor/s |
    eta 0:00:35``); a short one prints nothing."""
    if get_rank() != 0:
        yield from iterable
        return
    if sys.stderr.isatty():
        from tqdm.auto import tqdm

        yield from tqdm(iterable, desc=desc, total=total, unit=unit, dynamic_ncols=True)
        return
    started = last = time.monotonic()
    done, said = 0, 0
    for item in iterable:
        yield item
        done += 1
        now = time.monotonic()
        if now - last >= PROGRESS_INTERVAL_S:
            last, said = now, done
            _progress_line(desc, done, total, unit, now - started)
    if said and said != done:
        _progress_line(desc, done, total, unit, time.monotonic() - started)


def _progress_line(desc: str, done: int, total: int | None, unit: str, elapsed_s: float) -> None:
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    eta = str(datetime.timedelta(seconds=round((total - done) / rate))) if total and rate > 0 else "?"
    count = f"{done}/{total}" if total else str(done)
    print(f"{desc}: {count} {unit} | {rate:.3g} {unit}/s | eta {eta}", file=sys.stderr, flush=True)
