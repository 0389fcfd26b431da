"""`make_tiny` reuses a folder only when it holds the tiny set asked for."""

from __future__ import annotations

import pytest
from wan22_train.tiny import CLIP, make_tiny, whole_clip_patch


def test_whole_clip_patch_covers_the_tiny_vae_latent_of_a_clip():
    # 2x spatial down-sampling, none in time: 5 frames of 16x16 -> a 5x8x8 latent
    assert whole_clip_patch({"num_frames": 5, "height": 16, "width": 16}) == (5, 8, 8)


def test_make_tiny_refuses_a_folder_with_clips_of_another_size(tmp_path):
    make_tiny(tmp_path, num_clips=1)
    with pytest.raises(
        ValueError, match=r"metadata.json: clip_0000.mp4 has 9 frames of 32x32, expected 5 of 16x16"
    ):
        make_tiny(tmp_path, num_clips=1, clip={**CLIP, "num_frames": 5, "height": 16, "width": 16})


def test_make_tiny_refuses_a_folder_with_a_predictor_of_another_config(tmp_path):
    make_tiny(tmp_path, num_clips=1)
    make_tiny(tmp_path, num_clips=1)  # the same set again: reused
    with pytest.raises(
        ValueError,
        match=r"transformer/config.json: written with patch_size=\[1, 2, 2\] \(expected \[9, 16, 16\]\)",
    ):
        make_tiny(tmp_path, num_clips=1, transformer={"patch_size": whole_clip_patch(CLIP)})


def test_diffusers_wan_pipeline_loads_the_make_tiny_folder_and_samples_from_it(tmp_path):
    from diffusers import UniPCMultistepScheduler, WanPipeline

    pipe = WanPipeline.from_pretrained(make_tiny(tmp_path, num_clips=1))
    assert isinstance(pipe.scheduler, UniPCMultistepScheduler) and pipe.transformer_2 is None
    latents = pipe(
        prompt="a red circle moving up", num_inference_steps=2, guidance_scale=1.0, output_type="latent",
        **{k: CLIP[k] for k in ("num_frames", "height", "width")},
    ).frames  # fmt: skip
    assert latents.shape == (1, 4, 5, 16, 16) and latents.isfinite().all()  # TINY_VAE: x2 in time and space
