"""signal_when_launcher_dies: a worker ends when the process that started it is killed outright."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's"),
]

WORKER = textwrap.dedent(
    """
    import sys, time

    armed = False
    if sys.argv[1] == "arm":
        from mm_parallel import signal_when_launcher_dies

        armed = signal_when_launcher_dies()
    print("ready", armed, flush=True)
    time.sleep(120)
    """
)

LAUNCHER = textwrap.dedent(
    """
    import subprocess, sys
    worker = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
    print(worker.pid, flush=True)
    worker.wait()
    """
)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; its new parent may not have reaped it yet


def _kill_launcher(mode: str) -> tuple[int, str]:
    """Start launcher -> worker, kill the launcher with SIGKILL once the worker is ready; return the
    worker's pid and its ready line."""
    with subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, WORKER, mode], stdout=subprocess.PIPE, text=True
    ) as launcher:  # leaving the block closes its stdout and waits for it
        worker = int(launcher.stdout.readline())
        ready = launcher.stdout.readline().strip()  # the worker shares the launcher's stdout
        launcher.kill()
    return worker, ready


def _exits_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_an_armed_worker_gets_sigterm_when_its_launcher_is_killed():
    worker, ready = _kill_launcher("arm")
    assert ready == "ready True"
    assert _exits_within(worker, 10)


def test_a_worker_that_did_not_arm_outlives_its_launcher():  # what torchrun workers did before
    worker, ready = _kill_launcher("no")
    try:
        assert ready == "ready False"
        assert not _exits_within(worker, 2)
    finally:
        os.kill(worker, signal.SIGKILL)
