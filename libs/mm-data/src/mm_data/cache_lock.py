"""One preprocess run per cache folder: an exclusive ``flock`` on ``<cache>/.preprocess.lock``.

Two runs writing one cache would remove each other's staged samples and shards (each commit removes
what its own index does not list). Rank 0 of a run takes the lock before it plans and holds it until
its index is committed; a second run is refused at once with a :class:`CacheLockedError` naming the
holder (pid, host, start time, command line: what the holder wrote into the lock file).

Why ``flock`` and not mm-trainer's lease lock (``mm_trainer/run/lock.py``; mm-data cannot import
mm-trainer, docs/DESIGN.md "Layers"): the kernel drops an ``flock`` with its process, however it ends
(a killed run leaves no stale lock to judge, so nothing here takes one over), and it is the lock
mm-data's clip records already use. On a file system without ``flock`` (some NFS mounts) the lock
cannot be taken: the run goes on with a logged warning that concurrent runs are not excluded. The file
is never removed (removing a locked file lets two processes lock two files of one name); on release its
content is emptied, so a finished cache holds an empty ``.preprocess.lock``.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import IO, Any

__all__ = ["LOCK_NAME", "CacheLock", "CacheLockedError"]

logger = logging.getLogger("mm_data")

LOCK_NAME = ".preprocess.lock"
"""The lock file inside a cache folder (hidden: not part of the cache's content)."""


class CacheLockedError(RuntimeError):
    """Another preprocess run holds the cache folder."""


class CacheLock:
    """The exclusive lock of the cache folder ``root`` (see the module docstring); a context manager."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.path = self.root / LOCK_NAME
        self._file: IO[str] | None = None

    def acquire(self) -> CacheLock:
        """Take the lock, or raise :class:`CacheLockedError` naming the run that holds it."""
        self.root.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")  # noqa: SIM115 - held until release()
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read()
            handle.close()
            raise CacheLockedError(self._held_message(holder)) from None
        except OSError as e:
            logger.warning(
                "mm_data: cannot lock %s (%s): a second preprocess run of %s would not be stopped", self.path, e,
                self.root,
            )  # fmt: skip
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(_me()))
        handle.flush()
        self._file = handle
        return self

    def release(self) -> None:
        """Empty the lock file and drop the lock (closing the file). Never raises."""
        handle, self._file = self._file, None
        if handle is None:
            return
        try:
            handle.seek(0)
            handle.truncate()
        except OSError:
            pass
        finally:
            handle.close()

    def __enter__(self) -> CacheLock:
        return self.acquire()

    def __exit__(self, *_: Any) -> None:
        self.release()

    def _held_message(self, holder: str) -> str:
        try:
            who = json.loads(holder)
            described = f"pid {who['pid']} on host {who['host']}, started {who['started']}: {who['command']}"
        except (ValueError, KeyError, TypeError):
            described = "a run that has not written its name yet"
        return (
            f"{self.root} is being written by another preprocess run ({described}; lock file {self.path}). "
            "Two runs writing one cache remove each other's staged samples and shards: wait for it to "
            "finish (a re-run then encodes only what it did not), or stop it"
        )


def _me() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
