"""An exclusive lock file that stops two training runs from writing one directory.

The lock is a small JSON file, created whole by hard-linking a written temp file (atomic on local
and network file systems: it exists with its content or not at all), holding who owns it: pid, host,
start time, the kernel's boot id and process start time, and a lease: the holder rewrites the file
every ``lease_s / 4`` seconds (a daemon thread) with the time it did so (``renewed``).

A lock whose holder is gone is stale and is taken over, with a log line naming the old holder and why:
its lease expired (no renewal for ``lease_s`` seconds: the holder died or hangs, on any host; a
requeued job whose rank 0 lands on another node takes over its own lock that way), or, on the
holder's own host, the pid is dead, the machine rebooted since, or the pid now belongs to another
process (known at once, without waiting for the lease). A live lease held from another host is
refused with the holder's host, pid and the age of its last renewal. Lease ages compare the holder's
clock with the reader's: hosts sharing a save dir must agree on the time to well within the lease
(NTP does). A renewal time ahead of the reader's clock is reported as clock skew, with the skew, not
as a fresh lease; the lock then expires once the reader's clock has passed it by the lease. A lock file
that is empty or unreadable (its writer died mid-write, a damaged file system) names no holder: it is
stale once its file is older than the lease, and refused until then.

A takeover renames the stale file aside and checks that what it renamed is the holder it judged
stale, so that two processes taking over at once cannot both win.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

logger = logging.getLogger("mm_trainer")

LOCK_FILENAME = ".mm_train.lock"
"""Name of the lock file inside a locked directory (hidden, so exports never copy it)."""
DEFAULT_LEASE_S = 120.0
"""Seconds without a renewal after which a lock is stale on any host (``training.lock_lease_s``)."""
SKEW_TOLERANCE_S = 1.0
"""A renewal time this far ahead of the reader's clock is clock skew, not a fresh lease."""


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
    lease_s: float | None = None
    """Seconds the holder promised to renew within; None: a lock written before leases (no expiry)."""
    renewed: float | None = None
    """``time.time()`` of the holder's last renewal (on the holder's clock)."""

    @classmethod
    def me(cls, lease_s: float | None = None) -> LockHolder:
        pid = os.getpid()
        started = time.strftime("%Y-%m-%d %H:%M:%S %z")
        return cls(pid, socket.gethostname(), started, _boot_id(), _process_start(pid), lease_s, time.time())

    def lease_age(self) -> float | None:
        """Seconds since the holder's last renewal, None for a lock without a lease."""
        if self.renewed is None or self.lease_s is None:
            return None
        return max(0.0, time.time() - self.renewed)

    def clock_skew(self) -> float | None:
        """Seconds the holder's last renewal lies ahead of this host's clock (beyond
        :data:`SKEW_TOLERANCE_S`): the holder's clock runs ahead of this one's by at least that much; None
        when it does not."""
        if self.renewed is None or self.lease_s is None:
            return None
        ahead = self.renewed - time.time()
        return ahead if ahead > SKEW_TOLERANCE_S else None

    def describe(self) -> str:
        age, skew = self.lease_age(), self.clock_skew()
        if skew is not None:
            lease = (
                f", lease renewed {skew:.0f} s in the future by this host's clock: clock skew, host {self.host}'s "
                f"clock runs at least {skew:.0f} s ahead of {socket.gethostname()}'s, so the lease's age is unknown "
                f"here (it expires once this host's clock is {self.lease_s:g} s past that time; fix the clocks: NTP)"
            )
        elif age is not None:
            lease = f", lease renewed {age:.0f} s ago (expires after {self.lease_s:g} s)"
        else:
            lease = ""
        return f"pid {self.pid} on host {self.host}, started {self.started}{lease}"

    def is_me(self) -> bool:
        me = LockHolder.me()
        return (self.pid, self.host, self.process_start) == (me.pid, me.host, me.process_start)

    def gone(self) -> str | None:
        """Why the holder is gone (its lease expired; on its own host: its process is gone), or None."""
        age = self.lease_age()
        if age is not None and self.lease_s is not None and age > self.lease_s:
            return f"its lease expired: not renewed for {age:.0f} s (lease {self.lease_s:g} s)"
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
    """Exclusive ownership of ``directory`` through ``directory/.mm_train.lock``, by lease.

    ``acquire()`` creates the directory if needed and starts renewing the lease every ``lease_s / 4``
    seconds; :meth:`release` (also run at interpreter exit) stops that and removes the file if it is
    still this process's. A process may re-acquire a lock it holds itself (a second ``Trainer`` in one
    process). Setting :attr:`held` to False stops the renewals without removing the file.
    """

    def __init__(self, directory: str | os.PathLike, lease_s: float = DEFAULT_LEASE_S) -> None:
        if not lease_s > 0:
            raise ValueError(f"lease_s must be positive seconds, got {lease_s!r}")
        self.directory = Path(directory)
        self.path = self.directory / LOCK_FILENAME
        self.lease_s = lease_s
        self.held = False
        self._stop = threading.Event()

    def acquire(self) -> RunLock:
        """Take the lock or raise :class:`RunLockedError` naming the live holder."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            if self._create():
                self._start_renewing()
                return self
            holder = self._holder()
            if holder is None:
                if self._take_over_unreadable():
                    continue
                raise RunLockedError(self._unreadable_message())
            if holder.is_me():
                self.path.unlink(missing_ok=True)
                continue
            why = holder.gone()
            if why is None:
                raise RunLockedError(self._held_message(holder))
            if self._remove_stale(holder):
                logger.warning("%s: taking over the stale lock of %s (%s)", self.path, holder.describe(), why)
        raise RunLockedError(f"{self.path}: could not take the lock (another process keeps taking it)")

    def _file_age(self) -> float | None:
        """Seconds since the lock file was last written (this host's clock), None when it is gone."""
        try:
            return max(0.0, time.time() - self.path.stat().st_mtime)
        except OSError:
            return None

    def _take_over_unreadable(self) -> bool:
        """Remove an empty or unreadable lock file older than the lease (logged). Whether to try again
        (removed, or changed meanwhile); False: it is younger than the lease."""
        age = self._file_age()
        if age is None:
            return True  # gone meanwhile
        if age <= self.lease_s:
            return False
        if self._remove_stale(None):
            logger.warning(
                "%s: taking over an unreadable lock file (no holder in it; written %.0f s ago, longer than the "
                "lease of %g s)", self.path, age, self.lease_s,
            )  # fmt: skip
        return True

    def _unreadable_message(self) -> str:
        age = self._file_age()
        written = f"written {age:.0f} s ago" if age is not None else "gone meanwhile"
        return (
            f"{self.path} names no holder (empty or unreadable; {written}): a run that died writing it, or one "
            f"writing it now. It is taken over once older than the lease ({self.lease_s:g} s); if no run uses "
            f"{self.directory}, delete it"
        )

    def _start_renewing(self) -> None:
        self.held = True
        self._stop.clear()
        atexit.register(self.release)
        threading.Thread(
            target=self._renew_loop, name=f"run-lock-lease {self.directory}", daemon=True
        ).start()

    def _tmp_path(self, what: str) -> Path:
        return self.path.with_name(f"{LOCK_FILENAME}.{socket.gethostname()}.{os.getpid()}.{what}")

    def _create(self) -> bool:
        """Atomically create the lock file with its full content (hard link of a written temp file)."""
        tmp = self._tmp_path("tmp")
        tmp.write_text(json.dumps(vars(LockHolder.me(self.lease_s))))
        try:
            os.link(tmp, self.path)
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
        return True

    def _remove_stale(self, stale: LockHolder | None) -> bool:
        """Move the lock file aside if it still is ``stale``'s (None: still names no holder), else put back
        what another process wrote."""
        aside = self._tmp_path("stale")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False  # another process removed it first
        try:
            moved = LockHolder(**json.loads(aside.read_text()))
        except (OSError, ValueError, TypeError):
            moved = None
        if moved is not None and moved != stale:  # a new holder's file: give it back
            try:
                os.link(aside, self.path)
            except FileExistsError:
                pass
            aside.unlink(missing_ok=True)
            return False
        aside.unlink(missing_ok=True)
        return True

    def _renew_loop(self) -> None:
        """Rewrite the lock file with a fresh ``renewed`` time every ``lease_s / 4`` s while it is held."""
        while not self._stop.wait(self.lease_s / 4) and self.held:
            try:
                if not self.renew():
                    return
            except OSError as err:  # a full or read-only file system: the next renewal tries again
                logger.error("%s: could not renew the lease (%s); trying again", self.path, err)

    def renew(self) -> bool:
        """Renew the lease now (atomically replaced file); False, with an error logged, when the file is
        no longer this process's (taken over after the lease expired: this process stalled too long)."""
        holder = self._holder()
        if holder is None or not holder.is_me():
            if self.held:
                logger.error(
                    "%s: this run no longer holds its lock (now %s): another run may write %s",
                    self.path, holder.describe() if holder else "absent", self.directory,
                )  # fmt: skip
            return False
        tmp = self._tmp_path("renew")
        tmp.write_text(json.dumps(vars(replace(holder, renewed=time.time()))))
        os.replace(tmp, self.path)
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
            f"metrics: wait for it, or choose another directory. A run that is gone is taken over once "
            f"its lease expires; to take it over sooner, delete {self.path}"
        )

    def release(self) -> None:
        """Remove the lock file if this process still holds it. Never raises: a file system that refuses
        (read-only, gone) is logged, and the lock left expires with its lease."""
        self._stop.set()
        if not self.held:
            return
        self.held = False
        try:
            holder = self._holder()
            if holder is not None and holder.is_me():
                self.path.unlink(missing_ok=True)
        except Exception as err:  # noqa: BLE001 - at exit (atexit) too: nothing may escape
            logger.warning(
                "%s: could not remove the lock (%s: %s); it expires %g s after its last renewal",
                self.path, type(err).__name__, err, self.lease_s,
            )  # fmt: skip
