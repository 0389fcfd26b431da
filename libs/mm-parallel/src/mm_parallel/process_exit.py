"""Leaving a distributed process: run the exit handlers, then skip interpreter teardown.

Why: a gloo worker thread may still hold the last reference to a collective's work item when the
main thread returns (it drops it a moment after the main thread's ``wait()`` returns). A barrier's
work item keeps earlier ones, and their tensors, alive; freeing a tensor that has a Python object
takes the GIL. If that happens while the interpreter is finalizing, Python ends the thread with
``pthread_exit`` inside a ``noexcept`` destructor and the process aborts with "terminate called
without an active exception" (SIGABRT; seen on our 2-process CPU runs, core:
``~AsyncBarrierWork -> ~AsyncAllgatherWork -> TensorImpl::decref_pyobject -> take_gil``).
``destroy_process_group`` does not stop those threads while DeviceMeshes (cached by DTensor's
sharding propagation) still hold their groups, so they outlive ``main``.

:func:`exit_process` runs every ``atexit`` handler while the interpreter is whole (logging, user
hooks), flushes the standard streams, and ends the process with ``os._exit``: no teardown for a
worker thread to race with.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn


def exit_process(code: int) -> NoReturn:
    """End this process with ``code`` after its ``atexit`` handlers, without interpreter teardown.

    For command-line entry points of training processes, after the run closed its process groups.
    Not for library code or a process that still has work to do: nothing after it runs.
    """
    atexit._run_exitfuncs()  # the handlers a normal exit would run (logging.shutdown among them)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # closed or replaced streams
            pass
    os._exit(code)
