"""Non-finite steps, SIGTERM, profiling and unsupported options: what a long run meets."""

from __future__ import annotations

import math
import os
import signal
import time

import pytest
import torch
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


def test_an_lr_blow_up_withdraws_the_checkpoint_of_its_finite_loss_step_and_the_tracker_resumes_finite(
    toy_yaml, mm_train_forked, metrics_of
):
    """lr 1e30 on resume: step 5's loss is finite (computed before its update), its update takes the
    weights to ~1e30 and iteration 5 is saved (finite weights); step 6 is NaN. Iteration 5 was that
    step's input: the tracker moves back to 4, the error says to resume 4 and not 5, and the resume from
    what the tracker names trains finite losses."""
    from mm_checkpoint import latest_iteration
    from mm_checkpoint.dcp_io import DcpReader

    config = toy_yaml(training={"train_iters": 4, "save_interval": 2})
    save = config.parent / "ckpt"
    mm_train_forked(config)
    blow_up = ["training.lr=1e30", "training.train_iters=10", "training.save_interval=1",
               "training.nonfinite.max_consecutive=1"]  # fmt: skip
    with pytest.raises(AssertionError) as caught:
        mm_train_forked(config, *blow_up)
    error = str(caught.value)
    assert "NonFiniteLossError: step 7: non-finite loss" in error
    assert "step 6 is the first non-finite one of its streak" in error
    assert (
        f"resume from iteration 4 ({save / 'iter_0000004'}, which the tracker now names), not from iter_0000005"
        in error
    )
    records = metrics_of(save)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]  # step 7 raised
    assert math.isfinite(records[4]["loss"]) and not math.isfinite(records[5]["loss"])
    weights = DcpReader(save / "iter_0000005").read("predictor.blocks.0.fc1.weight")
    assert torch.isfinite(weights).all() and weights.abs().max() > 1e20  # committed: finite, blown up
    assert latest_iteration(save) == 4

    records = mm_train_forked(config, "training.train_iters=8")  # the tracker's checkpoint, the first lr
    assert [r["step"] for r in records[-4:]] == [5, 6, 7, 8]
    assert all(math.isfinite(r["loss"]) and not r["skipped"] for r in records[-4:])
