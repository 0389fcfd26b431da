"""Where the tiny Wan2.2 run's conditions come from does not change its training (Ulysses 2, 2 ranks):

- ``features.condition_micro_steps``: each rank of the context-parallel group VAE- and UMT5-encodes every other
  micro-batch;
- the encoder cache (``wan22-train preprocess`` + ``tiny_t2v_cached.yaml``): no encoder is loaded, the
  batches carry the cached latents and the caption embeddings drawn at train time.

Each run is ``wan22-train``'s ``main`` on 2 forked gloo ranks (the ``main_forked`` fixture). The online
run reads one window per clip (``frame_offset: start``, what a cache holds) and draws captions with
dropout over more than one epoch (6 steps x 2 samples of 8 clips), so the train-time draw is exercised.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from wan22_train.cli import main as wan22_main
from wan22_train.configs import config_path
from wan22_train.tiny import make_tiny, tiny_cached_overrides, tiny_overrides

pytestmark = pytest.mark.slow

STEPS = 6
DRAWS = ["data.dataset.seed=3", "data.dataset.caption_dropout=0.25"]
WAN_README = "apps/wan22-train/README.md"
PREPROCESS = "wan22-train preprocess --config configs/tiny_t2v_cached.yaml"
TRAIN_CACHED = "torchrun --nproc-per-node 2 -m wan22_train --config configs/tiny_t2v_cached.yaml"


def train(main_forked, config: str, save: Path, *overrides: str) -> list[float]:
    args = ["--config", str(config_path(config)), *overrides,
            f"training.save={save}", f"training.train_iters={STEPS}", "training.save_interval=100"]  # fmt: skip
    main_forked(wan22_main, args, nproc=2)
    return [json.loads(line)["loss"] for line in (save / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def online_losses(tiny, tmp_path_factory, main_forked) -> list[float]:
    """The reference: every condition encoded online by the rank that trains on it."""
    save = tmp_path_factory.mktemp("online")
    offset = "data.dataset.frame_offset=start"
    return train(main_forked, "tiny_t2v.yaml", save, *tiny_overrides(tiny), offset, *DRAWS)


def test_encoding_conditions_across_the_ulysses_group_gives_the_same_losses(
    tiny, online_losses, tmp_path, main_forked
):
    ahead = train(main_forked, "tiny_t2v.yaml", tmp_path / "ahead", *tiny_overrides(tiny),
                  "data.dataset.frame_offset=start", *DRAWS, "features.condition_micro_steps=2")  # fmt: skip
    assert len(online_losses) == STEPS
    assert ahead == online_losses


def test_training_from_the_encoder_cache_gives_the_online_losses(
    tiny, online_losses, tmp_path, main_forked, readme
):
    # The README's two lines, pointed at this test's model set and cache.
    overrides = tiny_cached_overrides(tiny, tmp_path / "cache")
    configs = {"configs": config_path("tiny_t2v_cached.yaml").parent}
    preprocess = readme.command(WAN_README, PREPROCESS, paths=configs, extra=tuple(overrides))
    assert wan22_main(preprocess[1:]) == 0  # in this process: one rank encodes all 8 clips
    assert len(list((tmp_path / "cache").glob("*.safetensors"))) == 8

    module, nproc, args = readme.launched(readme.command(WAN_README, TRAIN_CACHED, paths=configs))
    assert (module, nproc, args) == ("wan22_train", 2, ["--config", str(config_path("tiny_t2v_cached.yaml"))])
    cached = train(main_forked, "tiny_t2v_cached.yaml", tmp_path / "cached", *overrides, *DRAWS)

    assert len(cached) == STEPS
    assert cached == pytest.approx(online_losses, rel=1e-5)
