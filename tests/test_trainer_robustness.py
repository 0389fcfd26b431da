"""Non-finite steps, SIGTERM, profiling and unsupported options: what a long run meets."""

from __future__ import annotations

import os
import signal
import time

import pytest
from mm_trainer.run.exit_codes import EXIT_INCOMPLETE

pytestmark = pytest.mark.slow


def test_a_nan_step_is_skipped_and_counted_and_training_goes_on(toy_yaml, mm_train, metrics_of):
    config = toy_yaml(
        training={"train_iters": 6, "save_interval": 100}, model={"pipeline": {"nan_calls": [3]}}
    )
    proc = mm_train(config)
    records = metrics_of(config.parent / "ckpt")
    assert [r["skipped"] for r in records] == [False, False, True, False, False, False]
    # the skipped step names its samples: global ids, and which rows of the data they are
    skipped = (
        "step 3: non-finite loss nan / grad norm nan: step skipped (1 in a row, 1 in all); its samples: "
    )
    assert skipped + "global sample ids [8, 9, 10, 11] = data rows [" in proc.stderr
    assert records[-1]["skipped_total"] == 1
    assert all(r["loss"] == r["loss"] for i, r in enumerate(records) if i != 2)  # finite elsewhere


def test_max_skipped_stops_the_run_naming_the_skipped_steps_samples(toy_yaml, mm_train_forked):
    config = toy_yaml(
        training={"train_iters": 6, "save_interval": 100, "nonfinite": {"max_skipped": 1}},
        model={"pipeline": {"nan_calls": [2, 4]}},  # never two in a row: max_consecutive (5) is not reached
    )
    with pytest.raises(AssertionError, match=r"NonFiniteLossError: step 4: .*max_skipped=1\). Skipped steps: "
                       r"step 2: global sample ids \[4, 5, 6, 7\] = data rows \[.*\]; step 4: global sample ids "
                       r"\[12, 13, 14, 15\]"):  # fmt: skip
        mm_train_forked(config)


def test_nonfinite_action_stop_ends_the_run_with_a_clear_message(toy_yaml, mm_train_result):
    config = toy_yaml(
        training={"train_iters": 6, "save_interval": 100, "nonfinite": {"action": "stop"}},
        model={"pipeline": {"nan_calls": [2]}},
    )
    proc = mm_train_result(config)
    assert proc.returncode != 0
    assert "NonFiniteLossError" in proc.stderr and "training.nonfinite.action=stop" in proc.stderr
    save = config.parent / "ckpt"  # and where the failed run's files are
    assert f"mm-train: run directory: {save} (failed)" in proc.stdout.splitlines()
    assert "mm-train: last checkpoint: none written" in proc.stdout.splitlines()


def test_sigterm_saves_a_checkpoint_and_exits_incomplete(toy_yaml, mm_train_popen, metrics_of):
    config = toy_yaml(
        training={"train_iters": 200, "save_interval": 1000}, model={"pipeline": {"sleep_s": 0.05}}
    )
    proc = mm_train_popen(config)
    log = config.parent / "ckpt" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (log.exists() and len(log.read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=120) == EXIT_INCOMPLETE
    stopped_at = len(log.read_text().splitlines())
    tracker = config.parent / "ckpt" / "latest_checkpointed_iteration.txt"
    assert 3 <= stopped_at < 200 and int(tracker.read_text()) == stopped_at


def test_profile_writes_a_trace_for_the_step_range(toy_yaml, mm_train):
    config = toy_yaml(
        training={"train_iters": 4, "save_interval": 100},
        tools={"profile": {"enable": True, "start_step": 1, "end_step": 3}},
    )
    mm_train(config)
    trace = config.parent / "ckpt" / "profile" / "trace_rank0.json"
    assert trace.is_file() and trace.stat().st_size > 0
