"""SIGTERM and SIGINT as a request to stop after the current step, not as a crash.

A scheduler's SIGTERM (preemption, ``scancel``), a Ctrl-C, or a launcher that forwards one, may
reach some ranks only, and not at the same moment. A rank that acted on it alone would leave the
others blocked in the next collective. So a signal only marks this rank as asking to stop;
:class:`~mm_trainer.loop.engine.TrainEngine` adds the marks of all ranks inside its per-step
all-reduce, and every rank stops after the same step and saves the same iteration.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """Between :meth:`install` and :meth:`release`, SIGTERM and SIGINT set :attr:`received` instead
    of ending the process.

    Once one was received, :meth:`release` leaves the handlers in place: the process is about to
    exit, and a second signal (a launcher forwarding the first, a scheduler repeating it) must not
    turn a clean exit into a kill. Otherwise it puts the previous handlers back. Main thread only
    (a Python rule for signal handlers).
    """

    def __init__(self, signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> None:
        self.signals = signals
        self.received: str | None = None
        """Name of the first stop signal received (``"SIGTERM"``), None before one arrives."""
        self._previous: dict[signal.Signals, Any] = {}

    def install(self) -> StopSignals:
        """Catch the stop signals from now on; returns ``self``."""
        self._previous = {s: signal.signal(s, self._handle) for s in self.signals}
        return self

    def release(self) -> None:
        """Restore the previous handlers, unless a stop signal was received."""
        if self.received is None:
            for s, handler in self._previous.items():
                signal.signal(s, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum).name
