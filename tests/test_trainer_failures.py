"""A failure on one rank ends the whole run within a bounded time, printing the error and its rank."""

from __future__ import annotations

import sys

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="watches processes through /proc"),
]


def _log_dir_under_a_file(config) -> str:
    """A log directory rank 0 cannot create (only rank 0 writes logs): a file sits where its parent goes."""
    blocker = config.parent / "occupied"
    blocker.write_text("a file where the log directory's parent should be")
    return str(blocker / "logs")


@pytest.mark.parametrize("launcher", ["torchrun", "plain"])
def test_an_os_error_on_rank_0_only_ends_every_rank_non_zero_within_120_s(launcher, toy_yaml, processes):
    config = toy_yaml(training={"train_iters": 200, "save_interval": 1000})
    log_dir = _log_dir_under_a_file(config)
    procs = processes.start(config, f"training.log_dir={log_dir}", launcher=launcher)
    codes, output = processes.finish(procs, timeout=120)
    assert None not in codes, f"still running after 120 s: {codes}\n{output[-4000:]}"
    assert all(code != 0 for code in codes), output[-4000:]
    assert "[rank 0]" in output and "NotADirectoryError" in output and log_dir in output, output[-4000:]


def test_a_rank_that_stops_answering_fails_the_others_after_collective_timeout_s(toy_yaml, processes):
    config = toy_yaml(
        training={"train_iters": 200, "save_interval": 1000, "collective_timeout_s": 5},
        model={"pipeline": {"stall": {"rank": 1, "call": 3, "seconds": 600}}},
    )
    rank0, rank1 = processes.start(config, launcher="plain")  # no torchrun to stop the stalled rank
    try:
        codes, output = processes.finish([rank0], timeout=90)
    finally:
        rank1.kill()
        rank1.wait()  # reaped: a Popen collected while running is a ResourceWarning
    assert codes[0] not in (0, None), output[-4000:]
    assert "[rank 0]" in output and "Timed out waiting 5000ms" in output, output[-4000:]
