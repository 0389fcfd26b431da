"""``check_samples``: read every sample of a dataset once, in parallel, and list the bad ones (``mm-data check``).

The dataset's own ``check(indices)`` (:meth:`mm_data.VideoTextDataset.check`) reads one sample the way
training does (under its ``decode_timeout_s``) and returns what is bad; here DataLoader worker processes
run it over all indices, so a large dataset is checked at the speed of ``workers`` decoders, and each
sample is bounded by the deadline, so a hung file costs at most that long.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from torch.utils.data import DataLoader, Dataset

from .bad_samples import BadSample

__all__ = ["check_samples", "default_check_workers"]


class CheckableDataset(Protocol):
    """A dataset whose ``check(indices)`` reads those samples and returns the bad ones."""

    def __len__(self) -> int: ...

    def check(self, indices: Sequence[int] | None = None) -> list[BadSample]: ...


class _OneSampleChecks(Dataset):
    """Item ``i``: the bad-sample list of ``dataset.check([i])`` (empty when it is fine)."""

    def __init__(self, dataset: CheckableDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> list[BadSample]:
        return self.dataset.check([index])


def _as_is(found: list[BadSample]) -> list[BadSample]:
    return found


def default_check_workers() -> int:
    """Worker processes of ``mm-data check`` by default: the CPUs this process may use, at most 8."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(8, usable))


def _report_progress(done: int, total: int, bad: int) -> None:
    print(f"checked {done}/{total} samples, {bad} bad", file=sys.stderr, flush=True)


def check_samples(
    dataset: CheckableDataset,
    *,
    workers: int = 0,
    progress: Callable[[int, int, int], Any] | None = _report_progress,
    progress_every_s: float = 10.0,
) -> list[BadSample]:
    """The bad samples of ``dataset`` (every sample read once, ``workers`` processes; 0 = this process),
    by index. ``progress(done, total, bad)`` is called about every ``progress_every_s`` seconds and at the end."""
    if workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    loader = DataLoader(_OneSampleChecks(dataset), batch_size=None, num_workers=workers, collate_fn=_as_is)
    bad: list[BadSample] = []
    last = time.monotonic()
    for done, found in enumerate(loader, start=1):
        bad += found
        if progress is not None and (time.monotonic() - last >= progress_every_s or done == len(dataset)):
            progress(done, len(dataset), len(bad))
            last = time.monotonic()
    return sorted(bad, key=lambda b: b.index)
