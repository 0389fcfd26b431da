"""Two simulated nodes (two torchrun agents on one host, one worker each): when one node's agent is
SIGKILLed, its worker stops at an agreed step, saves and exits EXIT_INCOMPLETE, and the other node's
agent ends non-zero too, within 120 s, instead of reporting success (a scheduler must see "not finished").
Node 0's agent hosts the rendezvous store (``is_host``), as the first node of a job usually does; the
agent killed is node 1's.

The killed agent's worker is orphaned; this test process makes itself its child subreaper (Linux
``PR_SET_CHILD_SUBREAPER``) to collect that worker's exit code.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from mm_trainer.run.exit_codes import EXIT_INCOMPLETE

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreaper and /proc are Linux's"),
]

PR_SET_CHILD_SUBREAPER = 36


@contextlib.contextmanager
def child_subreaper() -> Iterator[None]:
    """Orphans below this process are re-parented to it (so their exit codes can be collected)."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0, os.strerror(ctypes.get_errno())
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def exit_code_within(pid: int, deadline: float) -> int | None:
    """Exit code of our (adopted) child ``pid`` once it ends, None if it still runs at ``deadline``."""
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def start_agents(config, command_env) -> list[subprocess.Popen]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agents = []
    for node in (0, 1):
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-agents",
            "--max-restarts", "0", "--rdzv-conf", f"is_host={node == 0}",  # node 0 holds the store
            "-m", "mm_trainer", "--config", str(config),
        ]  # fmt: skip
        with open(config.parent / f"node{node}.log", "w") as log:
            agents.append(subprocess.Popen(command, env=command_env, stdout=log, stderr=subprocess.STDOUT))
    return agents


def test_a_sigkilled_agent_ends_both_nodes_non_zero_within_120_s(toy_yaml, processes):
    config = toy_yaml(
        training={"train_iters": 200, "save_interval": 1000, "collective_timeout_s": 60},
        model={"pipeline": {"sleep_s": 0.05}},
    )
    ckpt = config.parent / "ckpt"
    with child_subreaper():
        agents = start_agents(config, processes.env())
        try:
            (worker1,) = processes.worker_pids(agents[1].pid, 1).values()
            processes.wait_for_steps(ckpt / "metrics.jsonl", 3, *agents)
            killed = time.monotonic()
            agents[1].kill()  # SIGKILL: the agent of node 1 is gone, its worker is left behind
            agents[1].wait()
            survivor = agents[0].wait(timeout=120)
            orphan = exit_code_within(worker1, killed + 120)
            elapsed = time.monotonic() - killed
        finally:
            for agent in agents:
                if agent.poll() is None:
                    agent.kill()
                    agent.wait()
    logs = "\n".join((config.parent / f"node{n}.log").read_text()[-3000:] for n in (0, 1))
    assert elapsed < 120, logs
    assert survivor != 0, logs  # the surviving agent reports the job as not finished
    assert orphan == EXIT_INCOMPLETE, logs  # the orphaned worker saved and said so
    assert f"exitcode  : {EXIT_INCOMPLETE} " in (config.parent / "node0.log").read_text(), logs
    steps = len((ckpt / "metrics.jsonl").read_text().splitlines())
    assert 3 <= steps < 200 and int((ckpt / "latest_checkpointed_iteration.txt").read_text()) == steps
