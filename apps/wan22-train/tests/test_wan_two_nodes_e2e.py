"""Two simulated nodes on this host: tiny Wan2.2 under a multi-node torchrun, HSDP across the nodes.

Each "node" is one ``torchrun --nnodes 2 --node-rank R --nproc-per-node 2`` process; both meet at one
c10d rendezvous on localhost and run 2 gloo workers each (c10d numbers the nodes in the order they
join; each node's workers get consecutive ranks). ``replicate_parallel_size: auto`` makes it HSDP
with the shard group inside a node (2 ranks) and the replicate group across the nodes. Its losses
are those of the single-node world-4 FSDP run (rel 1e-5): the same 4 samples a step, whatever the
layout. Node 1 is then killed mid-run (its agent and workers, SIGKILL); node 0 fails on its own, and
both restarted resume the last checkpoint and train the reference's remaining steps. Each node
stages the pretrained weights to its own directory (``training.stage_dir``), as on node-local disks.

One interrupted and one restarted two-node run plus the reference: 3 runs of 4 workers, 6 steps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from mm_checkpoint import latest_iteration
from wan22_train.configs import config_path
from wan22_train.tiny import make_tiny, tiny_overrides

pytestmark = pytest.mark.slow

STEPS = 6


def run_args(tiny: Path, save: Path, *extra: str) -> list[str]:
    """``wan22-train`` arguments: global batch 4 (one sample per rank at world 4), a save every 2 steps."""
    return ["--config", str(config_path("tiny_t2v.yaml")), *tiny_overrides(tiny), *extra,
            "parallel.ulysses_parallel_size=1", "training.micro_batch_size=1", "training.global_batch_size=4",
            f"training.train_iters={STEPS}", "training.save_interval=2", "training.log_sample_ids=true",
            "training.collective_timeout_s=60", f"training.save={save}"]  # fmt: skip


def records(save: Path) -> list[dict]:
    return [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]


def start_nodes(args: list[str], logs: Path, name: str, port: int) -> list[subprocess.Popen]:
    """Both nodes' torchrun agents on the rendezvous endpoint at ``port``; output in ``logs/<name>-node<R>.log``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = []
    for node in (0, 1):
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
            "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", name, "--max-restarts", "0", "-m", "wan22_train", *args,
        ]  # fmt: skip
        log = logs / f"{name}-node{node}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        proc.log = log
        procs.append(proc)
    return procs


def wait_all(procs: list[subprocess.Popen], timeout: float, kill_job) -> list[int]:
    deadline = time.monotonic() + timeout
    try:
        return [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            kill_job(p)
        logs = "\n".join(p.log.read_text()[-3000:] for p in procs)
        pytest.fail(f"the nodes did not finish in {timeout} s:\n{logs}")


def wait_for_steps(
    save: Path, steps: int, procs: list[subprocess.Popen], kill_job, timeout: float = 600
) -> None:
    log = save / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while not (log.exists() and len(log.read_text().splitlines()) >= steps):
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            for p in procs:
                kill_job(p)
            pytest.fail(
                "the two-node run ended or stalled early:\n"
                + "\n".join(p.log.read_text()[-3000:] for p in procs)
            )
        time.sleep(0.1)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, distributed, kill_job, free_port) -> dict:
    root = tmp_path_factory.mktemp("wan_two_nodes")
    tiny = make_tiny(root / "tiny")

    def single_node(rank: int, world: int) -> int:  # one node of 4: replicate_parallel_size auto = 1, FSDP
        from wan22_train.cli import main

        return main(run_args(tiny, root / "single_node"))

    assert distributed(single_node, 4, timeout=900) == [0] * 4

    save = root / "two_nodes"
    # each node copies the weights to its own "local disk" ($GROUP_RANK: torchrun's node index)
    args = run_args(tiny, save, f"training.stage_dir={root / 'node_local'}/$GROUP_RANK")
    first = start_nodes(args, root, "first", free_port())
    wait_for_steps(save, 3, first, kill_job)
    kill_job(first[1])  # node 1 goes down: its agent and workers
    node0_exit = wait_all(first[:1], 300, kill_job)[0]
    interrupted = records(save)
    last_checkpoint = latest_iteration(save)

    second = start_nodes(args, root, "restart", free_port())
    assert wait_all(second, 900, kill_job) == [0, 0], "\n".join(p.log.read_text()[-3000:] for p in second)
    return {
        "reference": records(root / "single_node"),
        "interrupted": interrupted,
        "node0_exit": node0_exit,
        "last_checkpoint": last_checkpoint,
        "resumed": records(save),
        "config": yaml.safe_load((save / "config.yaml").read_text()),
        "restart_log": second[0].log.read_text(),
        "staged": {
            node.name: sorted(p.name.rsplit("-", 1)[0] for p in node.iterdir())
            for node in (root / "node_local").iterdir()
        },
    }


def assert_same_steps(got: list[dict], expected: list[dict]) -> None:
    assert [r["step"] for r in got] == [r["step"] for r in expected]
    assert [r["sample_ids"] for r in got] == [r["sample_ids"] for r in expected]
    torch.testing.assert_close(
        torch.tensor([r["loss"] for r in got]), torch.tensor([r["loss"] for r in expected]), rtol=1e-5, atol=0
    )


def test_two_nodes_run_hsdp_with_one_replica_per_node(runs):
    parallel = runs["config"]["parallel"]
    assert (parallel["replicate_parallel_size"], parallel["fully_shard_parallel_size"]) == (2, 2)
    assert "replicate  2      2       crosses nodes (2)" in runs["restart_log"]


def test_two_nodes_with_hsdp_train_the_single_node_fsdp_losses(runs):
    interrupted = runs["interrupted"]
    assert len(interrupted) >= 3
    assert_same_steps(interrupted, runs["reference"][: len(interrupted)])


def test_a_killed_node_fails_the_other_and_both_restarted_resume_the_last_checkpoint(runs):
    last = runs["last_checkpoint"]
    assert runs["node0_exit"] != 0 and last is not None and last < STEPS
    assert f"at iteration {last}" in runs["restart_log"]
    assert_same_steps(runs["resumed"], runs["reference"])


def test_each_node_read_the_weights_from_its_own_local_copy(runs):
    assert runs["staged"] == {node: ["text_encoder", "transformer", "vae"] for node in ("0", "1")}
