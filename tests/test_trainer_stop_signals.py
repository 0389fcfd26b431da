"""SIGTERM on some ranks, or the death of their launcher, stops every rank at one saved iteration.

(SIGINT is the same stop: libs/mm-trainer/tests/test_engine_stop.py.)
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
from mm_trainer.run.exit_codes import EXIT_INCOMPLETE

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds torchrun's workers through /proc"),
]


def _long_run(toy_yaml):
    return toy_yaml(
        training={"train_iters": 200, "save_interval": 1000}, model={"pipeline": {"sleep_s": 0.05}}
    )


def _assert_one_checkpoint_at_the_last_logged_step(ckpt) -> int:
    steps = len((ckpt / "metrics.jsonl").read_text().splitlines())
    assert 3 <= steps < 200
    assert int((ckpt / "latest_checkpointed_iteration.txt").read_text()) == steps
    # one complete save, nothing half-written (.partial) beside it
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("iter_")) == [f"iter_{steps:07d}"]
    return steps


@pytest.mark.parametrize(
    ("signalled", "gap_s"),
    [((1,), 0.0), ((0, 1), 0.1)],
    ids=["rank 1", "rank 0, then rank 1 two steps later"],
)
def test_sigterm_on_some_ranks_saves_one_iteration_on_all_and_exits_incomplete(
    signalled, gap_s, toy_yaml, processes
):
    config = _long_run(toy_yaml)
    (torchrun,) = processes.start(config)
    workers = processes.worker_pids(torchrun.pid, 2)
    processes.wait_for_steps(config.parent / "ckpt" / "metrics.jsonl", 3, torchrun)
    for i, rank in enumerate(signalled):
        time.sleep(gap_s if i else 0)
        try:
            os.kill(workers[rank], signal.SIGTERM)
        except ProcessLookupError:
            # The agreed stop can save and exit within the gap on a fast machine; a signal
            # that finds its rank gone has nothing left to disturb.
            assert i > 0, "the first signalled worker ended before its signal"
    codes, output = processes.finish([torchrun], timeout=120)
    # every worker exits EXIT_INCOMPLETE (not finished); torchrun reports a non-zero worker as failed (1)
    assert codes == [1], output[-4000:]
    assert output.count(f"exitcode  : {EXIT_INCOMPLETE} ") == 2, output[-4000:]
    steps = _assert_one_checkpoint_at_the_last_logged_step(config.parent / "ckpt")
    assert f"saved iteration {steps}" in output


def test_workers_stop_when_their_torchrun_is_killed(toy_yaml, processes):
    config = _long_run(toy_yaml)
    (torchrun,) = processes.start(config)
    workers = processes.worker_pids(torchrun.pid, 2)
    processes.wait_for_steps(config.parent / "ckpt" / "metrics.jsonl", 3, torchrun)
    torchrun.kill()  # SIGKILL: torchrun gets no chance to stop its workers itself
    torchrun.wait()
    deadline = time.monotonic() + 60
    while any(processes.running(pid) for pid in workers.values()):
        assert time.monotonic() < deadline, (
            f"workers still running 60 s after their launcher died:\n{torchrun.log.read_text()[-4000:]}"
        )
        time.sleep(0.1)
    _assert_one_checkpoint_at_the_last_logged_step(config.parent / "ckpt")
