"""features.condition_mbs on the tiny Wan2.2 run with Ulysses 2: each rank of the context-parallel
group VAE- and UMT5-encodes every other micro-batch, and training is unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from wan22_train.configs import config_path
from wan22_train.tiny import make_tiny, tiny_overrides

pytestmark = pytest.mark.slow


def train(tmp_path, tiny, name: str, *overrides: str) -> list[float]:
    save = tmp_path / name
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "wan22_train", "--config", str(config_path("tiny_t2v.yaml")), *tiny_overrides(tiny),
           f"training.save={save}", "training.train_iters=6", "training.save_interval=100", *overrides]  # fmt: skip
    proc = subprocess.run(
        cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    return [json.loads(line)["loss"] for line in (save / "metrics.jsonl").read_text().splitlines()]


def test_encoding_conditions_across_the_ulysses_group_gives_the_same_losses(tmp_path):
    tiny = make_tiny(tmp_path / "tiny")
    plain = train(tmp_path, tiny, "plain")
    ahead = train(tmp_path, tiny, "ahead", "features.condition_mbs=2")
    assert len(plain) == 6
    assert ahead == plain
