"""mm-train end to end on the toy plugin: FSDP2 + recompute + activation offload, parity, resume.

Runs are mm-train's ``main`` on forked gloo ranks (``mm_train_forked``), except the SIGKILL test's run to
kill and its resume, which are real processes."""

from __future__ import annotations

import math
import os
import re
import signal
import time

import pytest
import torch

pytestmark = pytest.mark.slow


def losses(records: list[dict]) -> list[float]:
    return [r["loss"] for r in records]


def test_world_size_2_matches_world_size_1_and_the_loss_decreases(toy_yaml, mm_train_forked):
    # Global batch 8 either way: 2 ranks x micro 4, or 1 rank x micro 4 x 2 accumulation steps.
    two = toy_yaml("w2")
    one = toy_yaml("w1", training={"gradient_accumulation_steps": 2})
    l2 = losses(mm_train_forked(two, nproc=2))
    l1 = losses(mm_train_forked(one))
    assert len(l1) == len(l2) == 30
    assert all(math.isfinite(x) for x in l2)
    assert sum(l2[:5]) / 5 > sum(l2[-5:]) / 5
    torch.testing.assert_close(torch.tensor(l2), torch.tensor(l1), rtol=1e-4, atol=0)


def test_a_run_killed_with_sigkill_resumes_with_identical_losses(
    toy_yaml, mm_train, mm_train_forked, mm_train_popen, metrics_of
):
    sections = {
        "training": {"train_iters": 20, "save_interval": 5},
        "model": {"pipeline": {"noise": "global"}},  # global RNG: reseeded per micro-batch from its key
        "data": {"dataset": {"num_samples": 24}},  # 3 steps an epoch: epochs roll over mid-run
    }
    reference = toy_yaml("reference", **sections)
    expected = losses(mm_train_forked(reference))

    crashed = toy_yaml("crashed", **sections)
    log = crashed.parent / "ckpt" / "metrics.jsonl"
    proc = mm_train_popen(crashed, "model.pipeline.sleep_s=0.2")
    try:
        deadline = time.monotonic() + 120
        while not (log.exists() and len(log.read_text().splitlines()) >= 12):
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "the run never reached step 12"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    killed_at = len(log.read_text().splitlines())
    assert killed_at < 20

    proc = mm_train(crashed, f"training.load={crashed.parent / 'ckpt'}")
    resumed_at = int(re.search(r"resumed from \S+ at iteration (\d+)", proc.stderr).group(1))
    assert resumed_at in (5, 10), f"resumed at {resumed_at}: expected the last complete checkpoint (5 or 10)"
    records = metrics_of(crashed.parent / "ckpt")
    assert [r["step"] for r in records] == list(range(1, 21))  # the killed run's later records were dropped
    assert losses(records) == expected  # bit-exact on CPU fp32


def test_cross_submodel_prefetch_from_the_yaml_trains_the_same_losses(toy_yaml, mm_train_forked, capfd):
    sections = {"training": {"train_iters": 6}}
    plain = toy_yaml("plain", **sections)
    crossed = toy_yaml(
        "crossed",
        parallel={"fsdp_plan": {"cross_submodel_prefetch": ["text_encoder", "predictor"]}},
        **sections,
    )
    plain_losses = losses(mm_train_forked(plain, nproc=2))
    capfd.readouterr()
    crossed_losses = losses(mm_train_forked(crossed, nproc=2))
    assert (
        "cross-sub-model prefetch: text_encoder gathers predictor" in capfd.readouterr().err
    )  # the ranks' log
    assert crossed_losses == plain_losses
