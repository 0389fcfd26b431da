"""Where the tiny Wan2.2 run's conditions come from does not change its training (Ulysses 2, 2 ranks):

- ``features.condition_micro_steps``: each rank of the context-parallel group VAE- and UMT5-encodes every other
  micro-batch;
- the encoder cache (``wan22-train preprocess`` + ``tiny_t2v_cached.yaml``): no encoder is loaded, the
  batches carry the cached latents and the caption embeddings drawn at train time; the sharded cache
  and its per-file copy (the layout of earlier versions) train the same losses at two layouts, a
  2-rank preprocess with UMT5 sharded over the ranks writes the same cache as one process, and a run
  whose preprocess section differs from what the cache records is refused before its model is built.

Each run is ``wan22-train``'s ``main`` on 2 forked gloo ranks (the ``main_forked`` fixture). The online
run reads one window per clip (``frame_offset: start``, what a cache holds) and draws captions with
dropout over more than one epoch (6 steps x 2 samples of 8 clips), so the train-time draw is exercised.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mm_data import CACHE_MANIFEST, CacheIndex, CacheMismatchError, write_per_file_copy
from wan22_train.cli import main as wan22_main
from wan22_train.configs import config_path
from wan22_train.tiny import make_tiny, tiny_cached_overrides, tiny_overrides

pytestmark = pytest.mark.slow

STEPS = 6
DRAWS = ["data.dataset.seed=3", "data.dataset.caption_dropout=0.25"]
WAN_README = "apps/wan22-train/README.md"
PREPROCESS = "wan22-train preprocess --config apps/wan22-train/configs/tiny_t2v_cached.yaml"
TRAIN_CACHED = (
    "torchrun --nproc-per-node 2 -m wan22_train --config apps/wan22-train/configs/tiny_t2v_cached.yaml"
)


def train(main_forked, config: str, save: Path, *overrides: str, steps: int = STEPS) -> list[float]:
    args = ["--config", str(config_path(config)), *overrides,
            f"training.save={save}", f"training.train_iters={steps}", "training.save_interval=100"]  # fmt: skip
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


@pytest.fixture(scope="module")
def cache(tiny, tmp_path_factory, main_forked, readme) -> Path:
    """The README's ``wan22-train preprocess`` line on one forked rank (one thread, as each rank of the
    2-rank runs below), pointed at this module's model set: the sharded cache of the 8 clips."""
    out = tmp_path_factory.mktemp("cache")
    configs = {"apps/wan22-train/configs": config_path("tiny_t2v_cached.yaml").parent}
    preprocess = readme.command(
        WAN_README, PREPROCESS, paths=configs, extra=tuple(tiny_cached_overrides(tiny, out))
    )
    main_forked(wan22_main, preprocess[1:])
    return out


LAYOUTS = {"ulysses2": [], "dp2": ["parallel.ulysses_parallel_size=1"]}


@pytest.fixture(scope="module")
def cached_losses(tiny, cache, tmp_path_factory, main_forked):
    """``cached_losses(kind, layout, steps)``: the losses of a run from the sharded cache (``kind``
    ``sharded``) or its per-file copy (``per_file``) at a layout of ``LAYOUTS``; each run once per module
    (a shorter run's losses are the first steps of a longer one's)."""
    per_file = write_per_file_copy(cache, tmp_path_factory.mktemp("per_file"))
    roots, done = {"sharded": cache, "per_file": per_file}, {}

    def losses(kind: str, layout: str, steps: int = STEPS) -> list[float]:
        if len(done.get((kind, layout), [])) < steps:
            save = tmp_path_factory.mktemp(f"{kind}_{layout}")
            overrides = [*tiny_cached_overrides(tiny, roots[kind]), *DRAWS, *LAYOUTS[layout]]
            done[kind, layout] = train(main_forked, "tiny_t2v_cached.yaml", save, *overrides, steps=steps)
        return done[kind, layout][:steps]

    losses.per_file = per_file
    return losses


def test_training_from_the_encoder_cache_gives_the_online_losses(cache, cached_losses, online_losses, readme):
    configs = {"apps/wan22-train/configs": config_path("tiny_t2v_cached.yaml").parent}
    module, nproc, args = readme.launched(readme.command(WAN_README, TRAIN_CACHED, paths=configs))
    assert (module, nproc, args) == ("wan22_train", 2, ["--config", str(config_path("tiny_t2v_cached.yaml"))])
    index = CacheIndex.load(cache)
    assert index.num_samples == 8 and sum(len(s.keys) for s in index.shards) == 8
    cached = cached_losses("sharded", "ulysses2")
    assert len(cached) == STEPS
    assert cached == pytest.approx(online_losses, rel=1e-5)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_sharded_and_the_per_file_cache_train_the_same_losses(cached_losses, layout):
    assert (cached_losses.per_file / CACHE_MANIFEST).is_file()
    assert len(list(cached_losses.per_file.glob("*.safetensors"))) == 8
    sharded = cached_losses("sharded", layout, steps=3)
    assert len(sharded) == 3
    assert cached_losses("per_file", layout, steps=3) == sharded


def test_a_packed_run_from_the_cache_logs_the_unpacked_cached_runs_first_loss(
    tiny, cache, cached_losses, tmp_path, main_forked
):
    """``data.packing`` from the cache: each sample's tokens come from its cached latents' shape (no VAE in the
    run), its packed step within 1e-5 of the unpacked one (dp 2)."""
    overrides = [
        *tiny_cached_overrides(tiny, cache),
        *DRAWS,
        *LAYOUTS["dp2"],
        "data.packing.token_budget=4096",
    ]
    packed = train(main_forked, "tiny_t2v_cached.yaml", tmp_path / "packed", *overrides, steps=1)
    unpacked = cached_losses("sharded", "dp2", steps=3)[0]
    assert abs(packed[0] - unpacked) <= 1e-5 * abs(unpacked)


def test_two_ranks_with_umt5_sharded_over_them_write_the_one_rank_cache(tiny, cache, tmp_path, main_forked):
    """``torchrun``'s path (2 forked gloo ranks): the ranks split the clips, UMT5 is FSDP-sharded over them
    (``run.text_encoder_fsdp: true``) and called in lockstep; the cache has the one-process run's bytes."""
    two = tmp_path / "two"
    args = ["preprocess", "--config", str(config_path("tiny_t2v_cached.yaml")), *tiny_cached_overrides(tiny, two),
            "data.dataset.preprocess.run.text_encoder_fsdp=true", "data.dataset.preprocess.run.decode_workers=1"]  # fmt: skip
    main_forked(wan22_main, args, nproc=2)

    def files(root: Path) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in root.iterdir() if p.name.startswith(("shard-", "index"))}

    assert files(two) == files(cache) and len(files(cache)) >= 2


def _first_words_of(rank: int, world_size: int, overrides: list[str]) -> tuple[str | None, bool]:
    """``Trainer(config)`` on this rank: the cache check's refusal, and whether a model was built first."""
    from mm_config import load_config
    from mm_trainer import Trainer

    built = []

    def build_model(self):
        built.append(True)
        raise AssertionError("the model was built before the cache was checked")

    Trainer._build_model = build_model  # this forked rank's class only: says whether the build came first
    try:
        Trainer(load_config(str(config_path("tiny_t2v_cached.yaml")), overrides, world_size=world_size))
    except CacheMismatchError as e:
        return str(e), bool(built)
    return None, bool(built)


def test_a_run_whose_preprocess_section_differs_from_the_cache_is_refused_before_its_model_is_built(
    tiny, cache, tmp_path, distributed
):
    """The cache was preprocessed at 32x32; a run whose section says 16x16 is refused naming the key and
    both values."""
    overrides = [*tiny_cached_overrides(tiny, cache), "parallel.ulysses_parallel_size=1", f"training.save={tmp_path}",
                 "data.dataset.preprocess.clips.height=16", "data.dataset.preprocess.clips.width=16"]  # fmt: skip
    [(refusal, built)] = distributed(_first_words_of, 1, overrides)
    assert refusal is not None and not built
    assert "data.dataset.preprocess.clips.height: the cache was made with 32, this run says 16" in refusal
    assert "data.dataset.preprocess.clips.width: the cache was made with 32, this run says 16" in refusal
    assert "data.dataset.preprocess.clips.num_frames" not in refusal
