"""features.condition_mbs on the tiny Wan2.2 run with Ulysses 2: each rank of the context-parallel
group VAE- and UMT5-encodes every other micro-batch, and training is unchanged.

Each run is ``wan22-train``'s ``main`` on 2 forked gloo ranks (the ``main_forked`` fixture)."""

from __future__ import annotations

import json

import pytest
from wan22_train.cli import main as wan22_main
from wan22_train.configs import config_path
from wan22_train.tiny import make_tiny, tiny_overrides

pytestmark = pytest.mark.slow


def train(main_forked, tmp_path, tiny, name: str, *overrides: str) -> list[float]:
    save = tmp_path / name
    args = ["--config", str(config_path("tiny_t2v.yaml")), *tiny_overrides(tiny),
            f"training.save={save}", "training.train_iters=6", "training.save_interval=100", *overrides]  # fmt: skip
    main_forked(wan22_main, args, nproc=2)
    return [json.loads(line)["loss"] for line in (save / "metrics.jsonl").read_text().splitlines()]


def test_encoding_conditions_across_the_ulysses_group_gives_the_same_losses(tmp_path, main_forked):
    tiny = make_tiny(tmp_path / "tiny")
    plain = train(main_forked, tmp_path, tiny, "plain")
    ahead = train(main_forked, tmp_path, tiny, "ahead", "features.condition_mbs=2")
    assert len(plain) == 6
    assert ahead == plain
