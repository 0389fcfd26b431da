"""Progress of the long steps outside training (the planner's trace, a dry run, a tiny VAE's fit): the
phase a command is in, and how far a phase of known length got, at what rate, with an estimate of the
time left.

As training's console (``mm_trainer.loop.metrics``): on a terminal a tqdm bar, otherwise plain lines,
one when a counted phase has run ``interval_s`` seconds and every ``interval_s`` after, and one at its
end: ``plan: forward 12/40 FSDP units | 1.21 units/s | eta 0:00:23``. A phase shorter than
``interval_s`` prints no count line (its start line says it began).
"""

from __future__ import annotations

import datetime
import sys
import time
from typing import Any, TextIO

from tqdm import tqdm

INTERVAL_S = 10.0
"""Seconds between two progress lines without a terminal."""


def clock(seconds: float) -> str:
    """``H:MM:SS`` of ``seconds`` (rounded)."""
    return str(datetime.timedelta(seconds=round(max(seconds, 0.0))))


def progress_line(label: str, done: int, total: int | None, unit: str, elapsed_s: float) -> str:
    """One plain line: ``label done/total unit | rate unit/s | eta H:MM:SS`` (eta: at the mean rate so far)."""
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    count = f"{done}/{total}" if total else f"{done}"
    eta = clock((total - done) / rate) if total and rate > 0 else "?"
    return f"{label} {count} {unit} | {rate:.3g} {unit}/s | eta {eta}"


def is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class Progress:
    """The progress of one phase of ``total`` units (None: unknown): :meth:`advance` as units are done,
    :meth:`close` (or the ``with`` block's end) when the phase ends."""

    def __init__(
        self,
        label: str,
        total: int | None,
        unit: str,
        *,
        prefix: str = "",
        stream: TextIO | None = None,
        interval_s: float | None = None,
        enabled: bool = True,
    ) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.prefix, self.stream = prefix, stream or sys.stderr
        self.interval_s = INTERVAL_S if interval_s is None else interval_s
        self.enabled, self.done = enabled, 0
        self.started = self._last = time.monotonic()
        self._printed, self._said = False, -1
        self._bar = None
        if enabled and is_terminal(self.stream):
            self._bar = tqdm(
                total=total, desc=f"{prefix}{label}", unit=unit, file=self.stream, dynamic_ncols=True,
                leave=False, delay=1.0,
            )  # fmt: skip

    def advance(self, n: int = 1) -> None:
        """``n`` more units done."""
        self.done += n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._last = now
            self._say(now)

    def close(self) -> None:
        """End the phase: close the bar, or print the last line where lines were printed."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.enabled and self._printed and self._said != self.done:
            self._say(time.monotonic())
        self.enabled = False

    def _say(self, now: float) -> None:
        line = progress_line(self.label, self.done, self.total, self.unit, now - self.started)
        print(f"{self.prefix}{line}", file=self.stream, flush=True)
        self._printed, self._said = True, self.done

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class PhaseLog:
    """The phases of one long command, each line with the seconds since the command started
    (``[plan   42 s] micro-step 1/1: backward``); :meth:`count` follows a phase of known length.

    Call it with a line to announce a phase (what the planner's ``progress`` callbacks take)."""

    def __init__(
        self,
        name: str,
        *,
        stream: TextIO | None = None,
        interval_s: float | None = None,
        enabled: bool = True,
    ) -> None:
        self.name, self.stream, self.enabled = name, stream or sys.stderr, enabled
        self.interval_s = interval_s
        self.started = time.monotonic()

    def __call__(self, line: str) -> None:
        if self.enabled:
            first = (line.splitlines() or [""])[0]
            print(f"[{self.name} {time.monotonic() - self.started:5.0f} s] {first[:160]}", file=self.stream,
                  flush=True)  # fmt: skip

    def count(self, label: str, total: int | None, unit: str) -> Progress:
        """A :class:`Progress` of ``total`` ``unit`` for the phase ``label``."""
        return Progress(
            label, total, unit, prefix=f"{self.name}: ", stream=self.stream, interval_s=self.interval_s,
            enabled=self.enabled,
        )  # fmt: skip


SILENT = PhaseLog("", enabled=False)
"""A :class:`PhaseLog` that prints nothing (the default of library calls)."""
