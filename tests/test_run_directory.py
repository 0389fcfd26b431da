"""A run owns its save dir: the same config run again resumes it, and a second live run is refused."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
from mm_checkpoint import checkpoint_info
from mm_trainer.run.exit_codes import EXIT_DESTINATION


def train_once(build, config: Path, world_size: int, *overrides: str) -> tuple[int, int]:
    trainer = build(config, world_size, *overrides)
    try:
        return trainer.start_iteration, trainer.train()
    finally:
        trainer.close()


def saved(ckpt: Path) -> dict[str, float]:
    """Each checkpoint's save time: a checkpoint written again gets a new one."""
    return {p.name: checkpoint_info(ckpt, int(p.name[5:]))["time"] for p in sorted(ckpt.glob("iter_*"))}


@pytest.mark.slow
def test_running_the_same_config_twice_resumes_and_leaves_every_earlier_checkpoint(
    distributed, toy_yaml, metrics_of, toy_trainer
):
    config = toy_yaml(training={"train_iters": 6, "save_interval": 3, "keep_last": 2})
    ckpt = config.parent / "ckpt"
    assert distributed(lambda rank, world: train_once(toy_trainer, config, world), 2) == [(0, 6)] * 2
    first = saved(ckpt)
    assert list(first) == ["iter_0000003", "iter_0000006"]

    assert (
        distributed(lambda rank, world: train_once(toy_trainer, config, world), 2) == [(6, 6)] * 2
    )  # resumed at 6: nothing left to train
    assert saved(ckpt) == first  # neither replaced nor pruned
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "6"
    assert [r["step"] for r in metrics_of(ckpt)] == [1, 2, 3, 4, 5, 6]


def test_a_save_dir_in_use_by_a_live_run_is_refused_on_every_rank(distributed, toy_yaml, trainer_build_error):
    config = toy_yaml()
    ckpt = config.parent / "ckpt"
    holder = subprocess.Popen(["sleep", "60"])
    try:
        ckpt.mkdir()
        record = {"pid": holder.pid, "host": socket.gethostname(), "started": "2026-01-01 00:00:00 +0000"}
        (ckpt / ".mm_train.lock").write_text(json.dumps(record))

        messages = distributed(lambda rank, world: trainer_build_error(config, world), 2)
    finally:
        holder.kill()
        holder.wait()
    for message in messages:
        assert message.startswith("RunLockedError") and f"pid {holder.pid} on host" in message, message


@pytest.mark.slow
def test_a_save_dir_in_use_ends_each_rank_of_a_job_with_one_message_and_no_traceback(toy_yaml, processes):
    config = toy_yaml()
    ckpt = config.parent / "ckpt"
    holder = subprocess.Popen(["sleep", "120"])
    try:
        ckpt.mkdir()
        record = {"pid": holder.pid, "host": socket.gethostname(), "started": "2026-01-01 00:00:00 +0000"}
        (ckpt / ".mm_train.lock").write_text(json.dumps(record))
        codes, output = processes.finish(processes.start(config, launcher="plain"), timeout=120)
    finally:
        holder.kill()
        holder.wait()
    assert codes == [EXIT_DESTINATION, EXIT_DESTINATION], output[-4000:]
    errors = [line for line in output.splitlines() if "error" in line]
    assert errors == [
        f"mm-train: error: {ckpt} is in use by another training run (pid {holder.pid} on host "
        f"{socket.gethostname()}, started 2026-01-01 00:00:00 +0000; lock file {ckpt / '.mm_train.lock'}). "
        "Two runs writing one directory overwrite each other's checkpoints and metrics: wait for it, or "
        "choose another directory. A run that is gone is taken over once its lease expires; to take it "
        f"over sooner, delete {ckpt / '.mm_train.lock'}"
    ], output[-4000:]  # rank 0's, once: rank 1 raised the same error (on_rank0) and left it to rank 0
    assert "Traceback" not in output


@pytest.mark.slow
def test_a_second_run_sharing_a_log_dir_never_truncates_the_first_runs_metrics(toy_yaml, mm_train_forked):
    logs = toy_yaml().parent / "logs"  # one log dir, two runs with save dirs of their own
    first, second = (toy_yaml(name, training={"train_iters": 3, "log_dir": str(logs)}) for name in ("a", "b"))
    mm_train_forked(first)
    written = (logs / "metrics.jsonl").read_bytes()
    with pytest.raises(
        AssertionError, match="RunDirectoryError: training.log_dir .* holds the metrics of the run saving to"
    ):
        mm_train_forked(second)
    assert (logs / "metrics.jsonl").read_bytes() == written
    mm_train_forked(second, "training.resume=never", "training.train_iters=1")
    (moved,) = logs.parent.glob("logs.previous-*")
    assert (moved / "metrics.jsonl").read_bytes() == written  # moved aside whole, byte for byte
    assert [json.loads(line)["step"] for line in (logs / "metrics.jsonl").read_text().splitlines()] == [1]


def _plant_foreign_lock(ckpt: Path, age_s: float) -> None:
    """The lock a run on another node wrote, its lease last renewed ``age_s`` seconds ago."""
    record = {
        "pid": 4242, "host": "node-17", "started": "2026-01-01 00:00:00 +0000",
        "lease_s": 60.0, "renewed": time.time() - age_s,
    }  # fmt: skip
    (ckpt / ".mm_train.lock").write_text(json.dumps(record))


def test_a_lock_from_another_host_with_an_expired_lease_is_taken_over_and_the_run_resumes(
    distributed, toy_yaml, toy_trainer
):
    config = toy_yaml(training={"train_iters": 2, "save_interval": 2})
    ckpt = config.parent / "ckpt"
    assert distributed(lambda rank, world: train_once(toy_trainer, config, world), 1) == [(0, 2)]
    _plant_foreign_lock(ckpt, age_s=61)  # a requeued job: its rank 0 ran on node-17 and was killed
    resumed = distributed(
        lambda rank, world: train_once(toy_trainer, config, world, "training.train_iters=3"), 1
    )
    assert resumed == [(2, 3)]


def test_a_lock_from_another_host_with_a_live_lease_is_refused_naming_host_pid_and_lease_age(
    distributed, toy_yaml, trainer_build_error
):
    config = toy_yaml()
    ckpt = config.parent / "ckpt"
    ckpt.mkdir()
    _plant_foreign_lock(ckpt, age_s=5)
    (message,) = distributed(lambda rank, world: trainer_build_error(config, world), 1)
    assert message.startswith("RunLockedError") and "pid 4242 on host node-17" in message, message
    age = re.search(r"lease renewed (\d+) s ago \(expires after 60 s\)", message)
    assert age and 5 <= int(age.group(1)) < 60, message
