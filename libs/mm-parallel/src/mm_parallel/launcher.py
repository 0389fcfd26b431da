"""A worker process that ends with its launcher.

torchrun stops its workers when it exits on its own terms, but a launcher that is killed outright
(SIGKILL, the OOM killer) leaves them running: orphans that go on training and holding devices.
Linux can send a process a signal when its parent dies (``prctl(PR_SET_PDEATHSIG)``);
:func:`signal_when_launcher_dies` asks for it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def signal_when_launcher_dies(signum: int = signal.SIGTERM) -> bool:
    """Have the kernel send ``signum`` to this process when its parent process (the launcher) dies.

    Linux only; returns False elsewhere (nothing armed). Call it early in a worker: a launcher
    that died before the call is not noticed by it (under torchrun such a worker cannot join its
    rendezvous, whose store the launcher held, and fails there). The setting is not inherited by
    this process's own children.
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG, {signum}) failed: {os.strerror(errno)}")
    return True
