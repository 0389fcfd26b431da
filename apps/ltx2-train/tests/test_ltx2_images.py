"""Images in a video-only LTX-2 run (``audio: false``): ``preprocess`` caches each as one latent frame beside
the clips, the cached dataset serves the two shapes in separate buckets, and a run trains the images (a
one-frame sample is never conditioned on its only frame). A run that conditions every sample, or whose
transformer's patches span several frames, refuses the images before any weight is read, naming them."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from mm_config import load_config
from mm_trainer import SampleFramesError, check_samples

pytestmark = pytest.mark.slow

#: The tiny transformer shape with one-frame patches (``patch_size_t`` 1), randomly initialised.
EXTENSION = Path(__file__).resolve().parents[1] / "configs" / "tiny_t2av_extension.yaml"
VIDEO_ONLY = (
    "parallel.ulysses_parallel_size=1", "data.dataset.preprocess.audio=false", "model.pipeline.audio=false",
    "model.pipeline.first_frame_conditioning_p=0.5", "model.pipeline.conditioning_frames=1",
)  # fmt: skip
CLIP, IMAGE = 0, 1  # the rows of the mixed source


@pytest.fixture(scope="module")
def mixed(tiny_cache, run_config, tmp_path_factory) -> SimpleNamespace:
    """A source of one tiny clip (5 frames, 16 x 16) and one PNG, preprocessed with audio off by the tiny
    model set: the config, its overrides and the preprocess report."""
    from ltx2_train.preprocess import run_preprocess
    from mm_data import make_synthetic_dataset

    root = tmp_path_factory.mktemp("ltx2_images")
    source = make_synthetic_dataset(root / "media", num_clips=1, sizes=[(16, 16)], num_frames=(5,), fps=(8,),
                                    num_images=1)  # fmt: skip
    overrides = [*VIDEO_ONLY, f"data.dataset.preprocess.source={source}", f"data.data_path={root / 'cache'}"]
    config = run_config(tiny_cache, EXTENSION)
    report = run_preprocess(load_config(config, overrides, world_size=1))
    return SimpleNamespace(root=root, config=config, overrides=overrides, report=report)


def loaded(mixed: SimpleNamespace, *extra: str):
    return load_config(mixed.config, [*mixed.overrides, *extra], world_size=1)


def test_a_video_only_preprocess_caches_each_image_as_one_latent_frame_beside_the_clips(mixed):
    from ltx2_train.preprocess import IMAGE_FRAME_RATE, LTX2Encoders, preprocess_options, source_dataset
    from mm_trainer.registry.registries import DATA_REGISTRY

    assert mixed.report.computed == [CLIP, IMAGE]
    config = loaded(mixed)
    dataset = DATA_REGISTRY.get("ltx2_precomputed")(data_path=config.data.data_path)
    clip, image = dataset[CLIP], dataset[IMAGE]
    assert clip["latents"].shape == (8, 3, 4, 4) and image["latents"].shape == (8, 1, 4, 4)
    assert "audio_latents" not in clip and "audio_latents" not in image
    assert dataset.bucket_ids[CLIP] != dataset.bucket_ids[IMAGE]  # never one micro-batch
    assert float(clip["frame_rate"]) == 8.0 and float(image["frame_rate"]) == IMAGE_FRAME_RATE
    options = preprocess_options(config)
    frame = source_dataset(options).sample(IMAGE)["video"]
    assert frame.shape == (3, 1, 16, 16)
    encoders = LTX2Encoders.load(
        options.model_root, audio=False, device=torch.device("cpu"), dtype=torch.float32
    )
    torch.testing.assert_close(image["latents"], encoders.encode_video(frame), rtol=0, atol=0)


def test_a_video_only_run_trains_the_images_beside_the_clips(mixed, ltx2_train):
    """Two steps of one sample each, first-frame conditioning at 0.5: each step's logged samples mapped to
    their rows by the run's layout-free order; the image's step trains its 16 video tokens (1 x 4 x 4 latent
    grid at patch 1), the clip's its 48 (3 x 4 x 4)."""
    from mm_data import GlobalOrderSampler
    from mm_trainer.registry.registries import DATA_REGISTRY

    log_dir = mixed.root / "run"
    ltx2_train("--config", str(mixed.config), *mixed.overrides, "training.train_iters=2",
               "training.micro_batch_size=1", "training.log_sample_ids=true", "training.save=null",
               f"training.log_dir={log_dir}")  # fmt: skip
    rows = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    config = loaded(mixed)
    dataset = DATA_REGISTRY.get("ltx2_precomputed")(data_path=config.data.data_path)
    order = GlobalOrderSampler(dataset, global_batch_size=1, dp_rank=0, dp_size=1, seed=config.training.seed)
    trained = {order.dataset_index(i): r for r in rows for i in r["sample_ids"]}
    assert sorted(trained) == [CLIP, IMAGE]
    for row in rows:
        assert torch.isfinite(torch.tensor(row["loss"])) and row["loss"] > 0, row
    tokens = {row: round(r["tokens_per_s"] / r["samples_per_s"]) for row, r in trained.items()}
    assert tokens == {IMAGE: 16, CLIP: 48}  # each step's video tokens (no audio stream without audio)


def test_a_run_that_conditions_every_sample_refuses_the_images_naming_them(mixed):
    with pytest.raises(SampleFramesError) as refused:
        check_samples(loaded(mixed, "model.pipeline.first_frame_conditioning_p=1.0"))
    message = str(refused.value)
    assert (
        f"sample {IMAGE}: 1 latent frame(s) leave none to generate after model.pipeline.conditioning_frames=1"
        in message
    )
    assert "first_frame_conditioning_p < 1, under which an image trains unconditioned" in message
    assert f"sample {CLIP}" not in message
    check_samples(loaded(mixed))  # at 0.5 the image trains unconditioned: nothing to refuse


def test_a_transformer_whose_patches_span_frames_refuses_the_images_naming_them(
    mixed, tiny_cache, run_config
):
    """make-tiny's transformer (one token per clip: ``patch_size_t`` 3) cannot tile one latent frame."""
    config = load_config(run_config(tiny_cache), [*mixed.overrides, "model.pipeline.first_frame_conditioning_p=0"],
                         world_size=1)  # fmt: skip
    with pytest.raises(SampleFramesError) as refused:
        check_samples(config)
    message = str(refused.value)
    assert (
        f"sample {IMAGE}: latent grid (frames, height, width) = (1, 4, 4) does not divide into the transformer's "
        "patches (patch_size_t=3, patch_size=4)" in message
    )
    assert f"sample {CLIP}" not in message
