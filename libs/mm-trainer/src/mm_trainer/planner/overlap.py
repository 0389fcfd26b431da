"""Communication overlapped with compute in the traced step: the Ulysses all-to-all's head groups and
projections (``parallel.ulysses_overlap``).

mm-parallel's Ulysses all-to-alls are torch's functional collectives (``_c10d_functional.all_to_all_single``):
in eager mode a call returns at once and the collective is waited for at the first use of its result,
so compute issued in between runs while it is in flight (``overlap_heads=G``: every head group's
all-to-alls start together, group ``g``'s attention runs while groups ``g+1, ...`` are still
travelling; :mod:`mm_parallel.ulysses`). Under fake tensors torch waits at once instead, so the trace
puts the eager semantics back:

- **time** (:class:`AsyncTimeline`): a compute clock advanced by every traced op's roofline seconds and
  one link on which the collectives run one after another, each from when it is issued; the first op
  that reads a collective's result stalls the compute clock until it has arrived. What did not stall
  is hidden (``StepCost.overlapped_s``); with one head group the result is read at once, so nothing is
  hidden, the backward's transposed all-to-alls neither (each is read as soon as it is issued).
- **memory**: the collective holds its send buffer until it completes; the timeline keeps a reference to
  it until the first read of the result, so the peak sees every group's buffers in flight together.

The trace runs on CPU, whose overlap default is not the target's: :func:`target_overlap` gives the
traced calls the target device type's defaults. :data:`OVERLAP_DEFAULTS` is the one place where an
overlap mode with a per-device default plugs in (its table, read when a call leaves the mode unset);
a mode chosen in the config reaches the trace through the model build like any other key, and its
collectives are timed here as long as they are functional ones waited at first use.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from mm_parallel.ulysses import OVERLAP_HEADS_DEFAULT, OVERLAP_PROJECTIONS_DEFAULT
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from mm_trainer.planner.device_specs import DeviceSpec

ASYNC_COLLECTIVES = (torch.ops._c10d_functional.all_to_all_single.default,)
"""Collectives that run while compute goes on until their result is read (functional, eager)."""
WAIT = torch.ops._c10d_functional.wait_tensor.default
TRACED_DEVICE_TYPE = "cpu"


@dataclass(frozen=True)
class OverlapDefault:
    """An overlap mode whose value, when a call leaves it unset, comes from a per-device-type table."""

    name: str
    table: dict[str, int]
    """The mode's own table (device type -> value), as its library reads it at call time."""
    fallback: int
    """The value on a device type the table does not list (the library's)."""


OVERLAP_DEFAULTS: tuple[OverlapDefault, ...] = (
    OverlapDefault("ulysses overlap_heads", OVERLAP_HEADS_DEFAULT, 1),
    OverlapDefault("ulysses overlap_projections", OVERLAP_PROJECTIONS_DEFAULT, False),
)
"""Every overlap mode the trace runs at the target's default (module docstring): a new mode adds its table."""


@contextmanager
def target_overlap(device: DeviceSpec) -> Iterator[dict[str, int]]:
    """While tracing, the traced device type's entry of every :data:`OVERLAP_DEFAULTS` table is the
    target's (``device.device_type``); yields ``{mode: value}``. Restored after."""
    saved = {mode.name: mode.table.get(TRACED_DEVICE_TYPE) for mode in OVERLAP_DEFAULTS}
    chosen = {mode.name: mode.table.get(device.device_type, mode.fallback) for mode in OVERLAP_DEFAULTS}
    try:
        for mode in OVERLAP_DEFAULTS:
            mode.table[TRACED_DEVICE_TYPE] = chosen[mode.name]
        yield chosen
    finally:
        for mode in OVERLAP_DEFAULTS:
            if saved[mode.name] is None:
                mode.table.pop(TRACED_DEVICE_TYPE, None)
            else:
                mode.table[TRACED_DEVICE_TYPE] = saved[mode.name]


@dataclass
class _InFlight:
    kind: str
    seconds: float
    finish: float
    send: torch.Tensor | None
    """The send buffer, held (and so counted by the tracker) until the result is first read."""
    read: bool = False


def _passes_through(func: Any) -> bool:
    """The wait itself, views and metadata queries: no read of the data."""
    return func is WAIT or getattr(func, "is_view", False) or getattr(func, "namespace", "") == "prim"


class AsyncTimeline:
    """The compute clock and the link of the asynchronous collectives (module docstring)."""

    def __init__(self) -> None:
        self.clock = 0.0
        self.link_free = 0.0
        self.unread = 0
        self._results: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def start(self, kind: str, seconds: float, send: torch.Tensor, result: torch.Tensor) -> None:
        """A collective issued now: on the link after the ones before it."""
        begin = max(self.clock, self.link_free)
        self.link_free = begin + seconds
        self._results[result] = _InFlight(kind, seconds, self.link_free, send)
        self.unread += 1

    def before(self, func: Any, args: Any) -> list[tuple[str, float]]:
        """Before ``func(*args)``: an op that reads data stalls for the collectives whose result it is
        the first to read; returns ``(kind, hidden seconds)`` of each."""
        hidden: list[tuple[str, float]] = []
        if not self.unread or _passes_through(func):
            return hidden
        for t in tree_leaves(args):
            flight = self._results.get(t) if isinstance(t, torch.Tensor) else None
            if flight is None or flight.read:
                continue
            stall = max(0.0, flight.finish - self.clock)
            self.clock += stall
            flight.read, flight.send = True, None
            self.unread -= 1
            hidden.append((flight.kind, max(0.0, flight.seconds - stall)))
        return hidden

    def after(self, func: Any, args: Any, out: Any) -> None:
        """After ``func``: the wait, a view or a metadata query of an unread result hands it on (an
        eager ``AsyncCollectiveTensor`` waits at the first op that reads data, not at these)."""
        if not self.unread or not _passes_through(func):
            return
        flights = [self._results.get(t) for t in tree_leaves(args) if isinstance(t, torch.Tensor)]
        flight = next((f for f in flights if f is not None and not f.read), None)
        if flight is not None:
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self._results[t] = flight

    def compute(self, seconds: float) -> None:
        self.clock += seconds
