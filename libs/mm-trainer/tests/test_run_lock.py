"""RunLock: one run per directory; a live holder is named, a provably dead one is taken over."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from mm_trainer.run.lock import LOCK_FILENAME, LockHolder, RunLock, RunLockedError


@pytest.fixture
def other_process() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def _holder_of(pid: int) -> LockHolder:
    """The record a run with process ``pid`` on this host would have written."""
    me = LockHolder.me()
    return replace(me, pid=pid, started="2026-01-01 00:00:00 +0000", process_start=_start_of(pid))


def _start_of(pid: int) -> str | None:
    from mm_trainer.run.lock import _process_start

    return _process_start(pid)


def _plant(directory: Path, holder: LockHolder) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / LOCK_FILENAME).write_text(json.dumps(vars(holder)))
    return directory / LOCK_FILENAME


def test_acquire_writes_who_holds_the_lock_and_release_removes_it(tmp_path: Path) -> None:
    lock = RunLock(tmp_path / "run").acquire()
    holder = json.loads((tmp_path / "run" / LOCK_FILENAME).read_text())
    assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname() and holder["started"]
    lock.release()
    assert not (tmp_path / "run" / LOCK_FILENAME).exists()


def test_a_live_holder_is_refused_with_its_pid_and_host(tmp_path: Path, other_process) -> None:
    _plant(tmp_path, _holder_of(other_process.pid))
    with pytest.raises(RunLockedError) as err:
        RunLock(tmp_path).acquire()
    message = str(err.value)
    assert f"pid {other_process.pid} on host {socket.gethostname()}" in message and "in use" in message


def test_a_dead_holder_on_this_host_is_stale_and_taken_over(tmp_path: Path, caplog, other_process) -> None:
    holder = _holder_of(other_process.pid)
    other_process.kill()
    other_process.wait()
    lock_file = _plant(tmp_path, holder)
    with caplog.at_level(logging.WARNING, logger="mm_trainer"):
        RunLock(tmp_path).acquire().release()
    assert (
        f"taking over the stale lock of pid {holder.pid}" in caplog.text and "is not running" in caplog.text
    )
    assert not lock_file.exists()


def test_a_reused_pid_is_stale(tmp_path: Path, other_process) -> None:
    _plant(tmp_path, replace(_holder_of(other_process.pid), process_start="1"))  # pid now another process
    RunLock(tmp_path).acquire().release()


def test_a_holder_on_another_host_is_refused_with_how_to_clear_it(tmp_path: Path) -> None:
    lock_file = _plant(tmp_path, replace(_holder_of(1), host="node-17"))
    with pytest.raises(RunLockedError, match=f"host node-17.*delete {lock_file}"):
        RunLock(tmp_path).acquire()


def test_the_holding_process_may_take_it_again(tmp_path: Path) -> None:
    RunLock(tmp_path).acquire()
    RunLock(tmp_path).acquire().release()
    assert not (tmp_path / LOCK_FILENAME).exists()


def test_a_killed_holder_not_yet_reaped_is_stale(tmp_path: Path, other_process) -> None:
    lock_file = _plant(tmp_path, _holder_of(other_process.pid))
    other_process.kill()  # a zombie until waited for, as under a pid 1 that reaps nothing
    deadline = time.monotonic() + 10
    while Path(f"/proc/{other_process.pid}/stat").read_text().split(")")[-1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    RunLock(tmp_path).acquire().release()
    assert not lock_file.exists()


def test_a_live_lease_from_another_host_is_refused_with_host_pid_and_lease_age(tmp_path: Path) -> None:
    holder = replace(_holder_of(4242), host="node-17", lease_s=120.0, renewed=time.time() - 30)
    _plant(tmp_path, holder)
    with pytest.raises(RunLockedError, match=r"pid 4242 on host node-17.*lease renewed 3\d s ago"):
        RunLock(tmp_path).acquire()


def test_an_expired_lease_from_another_host_is_taken_over_with_a_log_line(tmp_path: Path, caplog) -> None:
    _plant(tmp_path, replace(_holder_of(4242), host="node-17", lease_s=60.0, renewed=time.time() - 61))
    with caplog.at_level(logging.WARNING, logger="mm_trainer"):
        lock = RunLock(tmp_path).acquire()
    assert "taking over the stale lock of pid 4242 on host node-17" in caplog.text
    assert "its lease expired" in caplog.text
    assert json.loads((tmp_path / LOCK_FILENAME).read_text())["pid"] == os.getpid()
    lock.release()


def test_the_holder_renews_its_lease_so_it_never_expires(tmp_path: Path) -> None:
    lock = RunLock(tmp_path, lease_s=1.0).acquire()
    first = json.loads((tmp_path / LOCK_FILENAME).read_text())["renewed"]
    time.sleep(1.3)  # past the lease: a holder that did not renew would be stale now
    holder = LockHolder(**json.loads((tmp_path / LOCK_FILENAME).read_text()))
    assert holder.renewed > first and holder.gone() is None
    lock.release()
    assert not (tmp_path / LOCK_FILENAME).exists()


def test_a_takeover_does_not_remove_a_lock_that_another_process_took_first(tmp_path: Path) -> None:
    stale = replace(_holder_of(4242), host="node-17", lease_s=1.0, renewed=time.time() - 10)
    newer = replace(stale, pid=4343, renewed=time.time())  # took it over just before us
    _plant(tmp_path, newer)
    assert not RunLock(tmp_path)._remove_stale(stale)
    assert json.loads((tmp_path / LOCK_FILENAME).read_text())["pid"] == 4343


@pytest.mark.parametrize("content", ["", '{"pid": 12'], ids=["empty", "unreadable"])
def test_an_empty_or_unreadable_lock_older_than_the_lease_is_stale_and_taken_over(
    tmp_path: Path, caplog, content: str
) -> None:
    lock_file = tmp_path / LOCK_FILENAME
    lock_file.write_text(content)
    with pytest.raises(
        RunLockedError, match=r"names no holder .*written 0 s ago.*taken over once older than the lease"
    ):
        RunLock(tmp_path, lease_s=60.0).acquire()  # young: perhaps a run writing it now
    old = time.time() - 61
    os.utime(lock_file, (old, old))
    with caplog.at_level(logging.WARNING, logger="mm_trainer"):
        lock = RunLock(tmp_path, lease_s=60.0).acquire()
    assert "taking over an unreadable lock file" in caplog.text and "written 61 s ago" in caplog.text
    assert json.loads(lock_file.read_text())["pid"] == os.getpid()
    lock.release()


def test_a_lease_renewed_in_the_future_is_reported_as_clock_skew_not_as_fresh(tmp_path: Path) -> None:
    _plant(tmp_path, replace(_holder_of(4242), host="node-17", lease_s=120.0, renewed=time.time() + 300))
    with pytest.raises(RunLockedError) as err:
        RunLock(tmp_path).acquire()
    message = str(err.value)
    assert "lease renewed 300 s in the future by this host's clock: clock skew" in message
    assert "host node-17's clock runs at least 300 s ahead" in message and "renewed 0 s ago" not in message


def test_release_never_raises_when_the_file_system_refuses_to_remove_the_lock(tmp_path: Path, caplog) -> None:
    """The lock's directory made unwritable (immutable for root, read-only otherwise): what a read-only
    file system does to the unlink at exit."""
    directory = tmp_path / "run"
    lock = RunLock(directory).acquire()
    if os.geteuid() == 0:
        made = subprocess.run(["chattr", "+i", str(directory)], capture_output=True)
        if made.returncode != 0:
            pytest.skip(
                f"root cannot make {directory} immutable here (chattr: {made.stderr.decode().strip()})"
            )
        undo = ["chattr", "-i", str(directory)]
    else:
        directory.chmod(0o555)
        undo = ["chmod", "755", str(directory)]
    try:
        with caplog.at_level(logging.WARNING, logger="mm_trainer"):
            lock.release()  # must not raise
    finally:
        subprocess.run(undo, check=True)
    assert (
        directory / LOCK_FILENAME
    ).exists() and "could not remove the lock (PermissionError" in caplog.text
