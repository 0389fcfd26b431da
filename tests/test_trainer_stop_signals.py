"""SIGTERM on some ranks, or the death of their launcher, stops every rank at one saved iteration.

(SIGINT is the same stop: libs/mm-trainer/tests/test_engine_stop.py.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mm_trainer.run.exit_codes import EXIT_CONFIG, EXIT_INCOMPLETE

REPO = Path(__file__).resolve().parents[1]


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


@pytest.mark.parametrize("signalled", ["a worker", "the launcher"])
def test_a_stopped_two_rank_job_under_the_launch_scripts_torchrun_exits_incomplete(
    signalled, toy_yaml, processes
):
    """``mm_trainer.run.torchrun`` (what launch/slurm.sbatch and launch/ascend.sh start): a stop ends the
    launcher with EXIT_INCOMPLETE, not torchrun's 1, whether a worker got the signal or the launcher did
    (a scheduler's stop; it sends the signal on to the workers, which save)."""
    config = _long_run(toy_yaml)
    (launcher,) = processes.start(config, launcher="wrapped")
    workers = processes.worker_pids(launcher.pid, 2)
    processes.wait_for_steps(config.parent / "ckpt" / "metrics.jsonl", 3, launcher)
    os.kill(workers[1] if signalled == "a worker" else launcher.pid, signal.SIGTERM)
    codes, output = processes.finish([launcher], timeout=120)
    assert codes == [EXIT_INCOMPLETE], output[-4000:]
    assert f"exiting {EXIT_INCOMPLETE}: not finished, resume it" in output
    steps = _assert_one_checkpoint_at_the_last_logged_step(config.parent / "ckpt")
    assert f"saved iteration {steps}" in output


def test_a_failed_two_rank_job_under_the_launch_scripts_torchrun_exits_1(toy_yaml, processes):
    config = toy_yaml(training={"train_iters": 6, "save_interval": 100, "nonfinite": {"action": "stop"}},
                      model={"pipeline": {"nan_calls": [2]}})  # fmt: skip
    (launcher,) = processes.start(config, launcher="wrapped")
    codes, output = processes.finish([launcher], timeout=120)
    assert codes == [1] and "NonFiniteLossError" in output, output[-4000:]


def test_a_user_error_on_every_rank_under_the_launch_scripts_torchrun_exits_its_code(toy_yaml, processes):
    """A checkpoint to load that is not there (a config error, EXIT_CONFIG, on both ranks; torchrun stops
    the rank that has not exited yet): the launcher exits 2 with one line, not torchrun's 1 and its
    failure summary."""
    config = toy_yaml(training={"train_iters": 2, "load": "/nonexistent/checkpoints"})
    (launcher,) = processes.start(config, launcher="wrapped")
    codes, output = processes.finish([launcher], timeout=120)
    assert codes == [EXIT_CONFIG], output[-4000:]
    assert f"every worker that exited early exited {EXIT_CONFIG} (an error to fix, told above" in output
    assert "/nonexistent/checkpoints" in output and "ChildFailedError" not in output


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


def _slurm_shims(folder):
    """``srun`` (one node: runs its command here), ``scontrol`` (``show hostnames``: this host;
    ``requeue``: recorded in ``scontrol.log``) and ``python`` (this interpreter) on a PATH folder."""
    folder.mkdir()
    shims = {
        "srun": '#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nexec "$@"\n',
        "scontrol": f'#!/bin/bash\nif [[ $1 == show ]]; then echo localhost; else echo "$*" >> {folder}/scontrol.log; fi\n',
        "python": f'#!/bin/bash\nexec {sys.executable} "$@"\n',
    }
    for name, text in shims.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


@pytest.mark.parametrize(
    ("sent", "requeued"), [(signal.SIGUSR1, True), (signal.SIGTERM, False)], ids=["time limit", "scancel"]
)
def test_the_slurm_script_exits_75_for_a_stopped_run_and_requeues_it_at_the_time_limit(
    sent, requeued, toy_yaml, processes, tmp_path
):
    """launch/slurm.sbatch under stand-ins for srun and scontrol on one node: SLURM's time-limit signal
    (USR1) stops the 2-rank run, which saves, and the job requeues itself; a cancel (TERM) stops it
    without requeueing. Either way the script exits 75."""
    shims = _slurm_shims(tmp_path / "shims")
    config = _long_run(toy_yaml)
    env = {**processes.env(), "PATH": f"{shims}:{os.environ['PATH']}", "SLURM_JOB_NUM_NODES": "1",
           "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": "4242", "NPROC_PER_NODE": "2",
           "RDZV_PORT": str(processes.free_port()), "NCCL_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}  # fmt: skip
    log = config.parent / "job.log"
    with open(log, "w") as out:
        job = subprocess.Popen(["bash", str(REPO / "launch" / "slurm.sbatch"), "--config", str(config)],
                               env=env, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    job.log = log
    processes.wait_for_steps(config.parent / "ckpt" / "metrics.jsonl", 3, job)
    os.kill(job.pid, sent)
    codes, output = processes.finish([job], timeout=120)
    assert codes == [EXIT_INCOMPLETE], output[-4000:]
    _assert_one_checkpoint_at_the_last_logged_step(config.parent / "ckpt")
    recorded = (shims / "scontrol.log").read_text() if (shims / "scontrol.log").exists() else ""
    assert recorded == ("requeue 4242\n" if requeued else ""), output[-4000:]
