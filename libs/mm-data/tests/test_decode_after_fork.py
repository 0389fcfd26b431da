"""A clip's decoder and scaler, still alive when the process forks (a DataLoader worker, ``mm-data check``),
can be freed in the child: FFmpeg's default worker threads are not started (they do not exist after a fork,
and freeing a context that has them waits on them forever)."""

from __future__ import annotations

import gc
import os
import time

import numpy as np
from mm_data import DecodeError, decode_frames
from mm_data import decode as decode_module
from mm_data.synthetic import write_clip


def _child_exit_status(pid: int, within_s: float) -> int | None:
    """The forked child's exit code, or None (after killing it) when it has not exited within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


def test_a_decoder_and_scaler_freed_in_a_forked_child_do_not_hang_it(tmp_path, monkeypatch):
    clip = tmp_path / "clip.mp4"
    write_clip(clip, np.random.default_rng(0).integers(0, 255, (9, 64, 64, 3), dtype=np.uint8), fps=8)
    real = decode_module._frame_to_array

    def fails_after_one_frame(*args):  # noqa: ANN002, ANN202 - the real conversion ran: the scaler exists
        real(*args)
        raise ValueError("stop after one decoded frame")

    monkeypatch.setattr(decode_module, "_frame_to_array", fails_after_one_frame)
    held: list[DecodeError] = []
    try:
        decode_frames(clip, [0, 1], 32, 32)
    except DecodeError as error:
        held.append(error)  # its traceback keeps the decoding frame, with its decoder and scaler, alive
    assert held and held[0].__cause__.__traceback__ is not None
    pid = os.fork()
    if pid == 0:  # the child frees them, as a garbage collection in a DataLoader worker would
        held.clear()
        gc.collect()
        os._exit(0)
    assert _child_exit_status(pid, within_s=20) == 0, "the forked child hung freeing the decoder"
