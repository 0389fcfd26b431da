"""Bookkeeping of samples that cannot be used, and the stop rule ``max_bad_fraction``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["BadSample", "BadSampleError", "BadSampleTracker"]

logger = logging.getLogger("mm_data")


@dataclass(frozen=True)
class BadSample:
    """A skipped sample: its dataset index, file path and why it was skipped."""

    index: int
    path: str
    reason: str


class BadSampleError(RuntimeError):
    """Too many bad samples: the message lists every bad path seen (by this process) and why.

    Constructible from the message alone, so a DataLoader worker re-raises it unchanged in the
    main process.
    """

    def __init__(self, message: str, bad: list[BadSample] | None = None) -> None:
        super().__init__(message)
        self.bad = list(bad or [])


class BadSampleTracker:
    """Counts distinct bad samples; raises :class:`BadSampleError` once they exceed the allowed fraction.

    The fraction is measured against the dataset length; each DataLoader worker holds its own
    tracker, so this limit applies per process. The global count is the trainer's: items name
    the samples they passed over (``skipped``) and ``mm_trainer`` sums them over workers and ranks.
    ``mm-data check`` scans every sample ahead of a run.
    """

    def __init__(self, total: int, max_bad_fraction: float) -> None:
        if not 0.0 <= max_bad_fraction <= 1.0:
            raise ValueError(f"max_bad_fraction must be in [0, 1], got {max_bad_fraction}")
        self.total = total
        self.max_bad_fraction = max_bad_fraction
        self._bad: dict[int, BadSample] = {}

    @property
    def bad_samples(self) -> list[BadSample]:
        """Bad samples seen so far, by index."""
        return [self._bad[i] for i in sorted(self._bad)]

    def record(self, bad: BadSample) -> None:
        """Log and count ``bad``; raise when the count exceeds ``max_bad_fraction * total``."""
        if bad.index not in self._bad:
            self._bad[bad.index] = bad
            logger.warning("mm_data: skipping bad sample %d (%s): %s", bad.index, bad.path, bad.reason)
        if len(self._bad) > self.max_bad_fraction * self.total:
            raise BadSampleError(self.report(), self.bad_samples)

    def first_good(
        self,
        candidates: Iterable[int],
        load: Callable[[int], dict[str, Any]],
        describe: Callable[[int, Exception], BadSample],
        errors: tuple[type[Exception], ...],
    ) -> dict[str, Any]:
        """``load`` the first candidate index that raises none of ``errors``; each that does is recorded
        (``describe`` names it) and listed in the returned item's ``skipped``.

        Raises:
            BadSampleError: past ``max_bad_fraction``, or when no candidate loads.
        """
        skipped: list[int] = []
        for source in candidates:
            try:
                item = load(source)
            except errors as e:
                self.record(describe(source, e))
                skipped.append(source)
                continue
            item["skipped"] = skipped
            return item
        raise BadSampleError(self.report(), self.bad_samples)

    def report(self) -> str:
        """A readable report of every bad sample and the limit."""
        lines = [
            f"{len(self._bad)} of {self.total} samples are bad "
            f"(max_bad_fraction={self.max_bad_fraction:g} allows {int(self.max_bad_fraction * self.total)}):"
        ]
        lines += [f"  [{b.index}] {b.path}: {b.reason}" for b in self.bad_samples]
        return "\n".join(lines)
