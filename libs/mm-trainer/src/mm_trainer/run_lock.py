"""An exclusive lock file that stops two training runs from writing one directory.

The lock is a small JSON file, created whole by hard-linking a written temp file (atomic on local
and network file systems: it exists with its content or not at all), holding who owns it: pid, host, start time, and the kernel's boot id and process start
time. A lock whose holder is provably gone is stale and is taken over, with a log line: same host
and the pid is dead, the machine rebooted since, or the pid now belongs to another process. A lock
held from another host cannot be checked from here; the error then says how to remove it.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger("mm_trainer")

LOCK_FILENAME = ".mm_train.lock"
"""Name of the lock file inside a locked directory (hidden, so exports never copy it)."""


class RunLockedError(RuntimeError):
    """The directory is locked by another live run."""


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def _boot_id() -> str | None:
    text = _read_text("/proc/sys/kernel/random/boot_id")
    return text.strip() if text else None


def _proc_stat(pid: int) -> list[str] | None:
    """Fields 3.. of ``/proc/<pid>/stat`` (state, ppid, ...), None where there is no such file."""
    text = _read_text(f"/proc/{pid}/stat")
    return text.rsplit(")", 1)[-1].split() if text else None  # after "pid (comm)"


def _process_start(pid: int) -> str | None:
    """Start time of ``pid`` in clock ticks since boot (field 22), None if unknown."""
    fields = _proc_stat(pid)
    return fields[19] if fields else None


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs here; a zombie (killed, not yet reaped: common under a container's pid 1)
    does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by another user
    fields = _proc_stat(pid)
    return not (fields and fields[0] in ("Z", "X"))


@dataclass(frozen=True)
class LockHolder:
    """Who holds a lock, as written in its file."""

    pid: int
    host: str
    started: str
    boot_id: str | None = None
    process_start: str | None = None

    @classmethod
    def me(cls) -> LockHolder:
        pid = os.getpid()
        started = time.strftime("%Y-%m-%d %H:%M:%S %z")
        return cls(pid, socket.gethostname(), started, _boot_id(), _process_start(pid))

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host}, started {self.started}"

    def is_me(self) -> bool:
        me = LockHolder.me()
        return (self.pid, self.host, self.process_start) == (me.pid, me.host, me.process_start)

    def gone(self) -> str | None:
        """Why the holder is provably gone (checked on this host only), or None."""
        if self.host != socket.gethostname():
            return None
        if not _pid_alive(self.pid):
            return f"pid {self.pid} is not running"
        if self.boot_id and _boot_id() and self.boot_id != _boot_id():
            return "the host rebooted since"
        now = _process_start(self.pid)
        if self.process_start and now and now != self.process_start:
            return f"pid {self.pid} is now another process"
        return None


class RunLock:
    """Exclusive ownership of ``directory`` through ``directory/.mm_train.lock``.

    ``acquire()`` creates the directory if needed; :meth:`release` (also run at interpreter exit)
    removes the file if it is still this process's. A process may re-acquire a lock it holds itself
    (a second ``Trainer`` in one process).
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LOCK_FILENAME
        self.held = False

    def acquire(self) -> RunLock:
        """Take the lock or raise :class:`RunLockedError` naming the live holder."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            if self._create():
                self.held = True
                atexit.register(self.release)
                return self
            holder = self._holder()
            if holder is None:
                raise RunLockedError(f"{self.path} is unreadable; if no run uses {self.directory}, delete it")
            if not holder.is_me():
                why = holder.gone()
                if why is None:
                    raise RunLockedError(self._held_message(holder))
                logger.warning("%s: taking over the stale lock of %s (%s)", self.path, holder.describe(), why)
            self.path.unlink(missing_ok=True)
        raise RunLockedError(f"{self.path}: could not take the lock (another process keeps taking it)")

    def _create(self) -> bool:
        """Atomically create the lock file with its full content (hard link of a written temp file)."""
        tmp = self.path.with_name(f"{LOCK_FILENAME}.{socket.gethostname()}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(vars(LockHolder.me())))
        try:
            os.link(tmp, self.path)
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
        return True

    def _holder(self) -> LockHolder | None:
        """The holder written in the lock file; None for an unreadable file (a writer died mid-write)."""
        try:
            data: dict[str, Any] = json.loads(self.path.read_text())
            return LockHolder(**data)
        except (OSError, ValueError, TypeError):
            return None

    def _held_message(self, holder: LockHolder) -> str:
        return (
            f"{self.directory} is in use by another training run ({holder.describe()}; lock file "
            f"{self.path}). Two runs writing one directory overwrite each other's checkpoints and "
            f"metrics: wait for it, or choose another directory. If that run is gone (e.g. it ran on "
            f"another host), delete {self.path}"
        )

    def release(self) -> None:
        """Remove the lock file if this process still holds it. Never raises."""
        if not self.held:
            return
        self.held = False
        holder = self._holder()
        if holder is not None and holder.is_me():
            self.path.unlink(missing_ok=True)
