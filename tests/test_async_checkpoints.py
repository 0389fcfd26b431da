"""training.async_save: checkpoints written in the background, committed only once complete.

A model big enough that its files take a while to write (a randomly initialized predictor of about
8M parameters: ~0.1 GB with AdamW's two moments) gives a window in which ``iter_*.partial`` exists
and the tracker still names the previous checkpoint: the state the kill and the stop below hit.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from mm_trainer.run.exit_codes import EXIT_INCOMPLETE

pytestmark = pytest.mark.slow

BIG = {
    "model": {
        "models": {
            "predictor": {
                "from_pretrained": None,
                "meta_init": False,
                "config": {"hidden": 1024, "num_blocks": 4},
            }
        }
    },
    "training": {"train_iters": 6, "save_interval": 2, "lr": 1e-4, "async_save": True},
}


def _tracker(ckpt: Path) -> int | None:
    tracker = ckpt / "latest_checkpointed_iteration.txt"
    return int(tracker.read_text()) if tracker.is_file() else None


def _wait_for_a_write_in_flight(ckpt: Path, after: int, *procs, timeout: float = 120) -> Path:
    """Wait until checkpoint ``after`` is committed and the next one is still being written."""
    deadline = time.monotonic() + timeout
    while True:
        partials = sorted(ckpt.glob("iter_*.partial"))
        if (_tracker(ckpt) or 0) >= after and partials:
            return partials[-1]
        assert all(p.poll() is None for p in procs), "the run ended before a save was caught writing"
        assert time.monotonic() < deadline, "no background save was caught writing"
        time.sleep(0.005)


def test_a_run_sigkilled_while_an_async_save_writes_resumes_from_the_previous_checkpoint(
    toy_yaml, mm_train_forked, mm_train_popen, metrics_of
):
    expected = [r["loss"] for r in mm_train_forked(toy_yaml("reference", **BIG))]

    crashed = toy_yaml("crashed", **BIG)
    ckpt = crashed.parent / "ckpt"
    proc = mm_train_popen(crashed)
    try:
        writing = _wait_for_a_write_in_flight(ckpt, 2, proc)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    complete = _tracker(ckpt)
    assert writing.is_dir(), "the kill came after the write was committed"
    assert complete is not None and complete < int(writing.name[5:12])  # the tracker never saw it

    records = mm_train_forked(crashed)
    assert [r["step"] for r in records] == list(range(1, 7))
    assert [r["loss"] for r in records] == expected  # resumed at `complete`: bit-exact on CPU fp32
    assert not list(ckpt.glob("*.partial")) and _tracker(ckpt) == 6


def test_sigterm_during_an_async_save_ends_after_it_completes_and_the_next_run_resumes(
    toy_yaml, processes, mm_train_forked
):
    config = toy_yaml(**BIG)
    ckpt = config.parent / "ckpt"
    procs = processes.start(config, "training.train_iters=40", nproc=2, launcher="plain")
    writing = _wait_for_a_write_in_flight(ckpt, 2, *procs)
    for proc in procs:
        os.kill(proc.pid, signal.SIGTERM)
    codes, output = processes.finish(procs, timeout=120)
    assert codes == [EXIT_INCOMPLETE] * 2, output[-4000:]
    stopped = len((ckpt / "metrics.jsonl").read_text().splitlines())
    assert 2 < stopped < 40 and f"saved iteration {stopped}" in output
    assert _tracker(ckpt) == stopped and not list(ckpt.glob("*.partial"))  # the stop save, committed
    assert (ckpt / writing.name.removesuffix(".partial")).is_dir()  # and the one in flight at the signal
    assert "GiB per rank in host memory" in output  # the staging copy is reported

    records = mm_train_forked(config, "training.train_iters=" + str(stopped + 1), nproc=2)
    assert [r["step"] for r in records] == list(range(1, stopped + 2))


class _Unpicklable:
    """Copied fine when a save stages it, refused by pickle when the writer serializes it."""

    def __deepcopy__(self, memo: dict) -> _Unpicklable:
        return _Unpicklable()

    def __reduce__(self):
        raise RuntimeError("this object cannot be written")


def test_a_failed_background_save_ends_the_run_at_a_step_after_it_with_its_error(
    distributed, toy_yaml, toy_trainer, metrics_of
):
    config = toy_yaml(training={"train_iters": 16, "save_interval": 8, "async_save": True})

    def body(rank: int, world: int) -> str:
        trainer = toy_trainer(config, world)
        trainer.lr_scheduler.broken = _Unpicklable()  # an attribute of a scheduler is in its state_dict
        try:
            trainer.train()
        except Exception as err:  # noqa: BLE001 - the error is the result
            return f"{type(err).__name__}: {err}"
        return "no error"

    (message,) = distributed(body, 1)
    assert message.startswith("CheckpointError: the background save of iteration 8"), message
    assert "cannot be written" in message
    # raised by the check after a step, not only by the next save (at 16): a write of a few KB ends
    # within the eight steps between them (three were too few on a loaded machine)
    assert 8 <= len(metrics_of(config.parent / "ckpt")) < 16
    assert not (config.parent / "ckpt" / "latest_checkpointed_iteration.txt").exists()
    assert not list((config.parent / "ckpt").glob("iter_*"))  # its iter_0000008.partial removed
