"""A deadline on reading one sample (``decode_timeout_s``): a sample that takes longer is a bad sample.

Why a helper thread, and not a timer signal: the reads a deadline must bound block where a signal
cannot reliably reach them. Opening a FIFO sleeps in the kernel until a writer appears; ``SIGALRM``
interrupts that sleep only when it is delivered to the blocked thread, Python runs its handler only in
the main thread (a DataLoader worker's main thread qualifies, a thread of the trainer does not), ffmpeg
retries reads interrupted by ``EINTR``, and a read on a hung network file system waits uninterruptibly,
deaf to every signal but ``SIGKILL``. Instead the sample is read in a helper thread and the caller waits
on it for at most the deadline: that bounds the caller's wait in every one of these cases, in the
training process and in each DataLoader worker alike (PyAV and PIL release the GIL while they block).
The price: a read that never returns keeps its (daemon) helper thread, and what it opened, until the
process ends; it is logged. Non-regular files are refused before they are opened
(:func:`mm_data.decode.require_regular_file`), so this is the rare case of a file that hangs.

Every rank of a context-parallel group reads the same sample: a sample that hangs times out on all of
them alike. Keep the deadline well above the slowest normal read, so that a merely slow sample does not
finish on one rank and time out on another.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from .decode import DecodeError

__all__ = ["SampleTimeout", "call_with_deadline"]

logger = logging.getLogger("mm_data")
T = TypeVar("T")


class SampleTimeout(DecodeError):
    """A sample was not read within its deadline."""


def call_with_deadline(load: Callable[[], T], seconds: float | None, what: str) -> T:
    """``load()``, or :class:`SampleTimeout` naming ``what`` once ``seconds`` pass without its result.

    ``seconds`` None runs ``load`` in the caller's thread, without a deadline. Exceptions of ``load`` are
    re-raised in the caller. See the module docstring for the mechanism and its price.
    """
    if seconds is None:
        return load()
    outcome: list[tuple[bool, object]] = []

    def run() -> None:
        try:
            outcome.append((True, load()))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            outcome.append((False, exc))

    helper = threading.Thread(target=run, name=f"mm-data read: {what}", daemon=True)
    helper.start()
    helper.join(seconds)
    if helper.is_alive():
        logger.warning(
            "mm_data: %s still reading after %g s; its reader thread is left behind", what, seconds
        )
        raise SampleTimeout(
            f"{what}: not read within decode_timeout_s={seconds:g} s (a hung or too slow read)"
        )
    ok, value = outcome[0]
    if ok:
        return value  # type: ignore[return-value]
    raise value  # type: ignore[misc]
