"""How long a collective may wait for the other ranks before it fails.

A rank that dies or stops answering leaves the others blocked in their next collective. The
process-group timeout bounds that wait: past it the collective raises (gloo) or the watchdog aborts
the communicator and ends the process (NCCL / HCCL), so a job never hangs longer than the timeout.

``init_process_group(timeout=...)`` sets it for the default group only: the groups a DeviceMesh
creates later take the backend's default (30 min for gloo, 10 min for NCCL) whatever the default
group has. :func:`set_collective_timeout` sets it on groups that already exist, through each
backend's ``set_timeout`` (the call torch's own ``dist.breakpoint`` makes to lengthen it).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from datetime import timedelta

import torch.distributed as dist


def as_timedelta(timeout_s: float | None) -> timedelta | None:
    """``timeout_s`` seconds as the ``timedelta`` torch.distributed takes; None stays None (backend default)."""
    if timeout_s is None:
        return None
    if timeout_s <= 0:
        raise ValueError(f"a collective timeout must be positive seconds, got {timeout_s!r}")
    return timedelta(seconds=timeout_s)


def new_long_wait_group(timeout_s: float) -> dist.ProcessGroup:
    """A gloo group of every rank whose collectives wait up to ``timeout_s``: for waits on work that one
    rank does alone (copying, hashing, converting weights; background checkpoint writes), so that the
    run's collective timeout can stay short. Collective: every rank calls it, in the same order."""
    return dist.new_group(backend="gloo", timeout=as_timedelta(timeout_s))


def set_collective_timeout(groups: Iterable[dist.ProcessGroup], timeout_s: float) -> None:
    """Make every collective on ``groups`` fail after ``timeout_s`` seconds without the other ranks.

    A backend that cannot change its timeout (a plugin backend without ``set_timeout``) keeps its
    own, with a warning naming it.
    """
    timeout = as_timedelta(timeout_s)
    for group in groups:
        for device in group._device_types:
            backend = group._get_backend(device)
            try:
                backend.set_timeout(timeout)
            except RuntimeError as err:
                warnings.warn(
                    f"process group {group.group_name} ({backend.name()} on {device}) keeps its own "
                    f"collective timeout, not {timeout_s} s: {err}",
                    stacklevel=2,
                )
