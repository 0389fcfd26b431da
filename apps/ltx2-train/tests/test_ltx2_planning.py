"""The LTX-2 micro-batch ``mm-train plan`` traces: the real shapes of ``ltx2_precomputed`` for a config."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from ltx2_train.planning import planning_batch, video_compression
from mm_config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TRANSFORMER = SimpleNamespace(config=SimpleNamespace(
    patch_size=1, patch_size_t=1, in_channels=128, caption_channels=3840, audio_in_channels=128,
    vae_scale_factors=(8, 32, 32),
))  # fmt: skip


def test_without_the_vae_folder_the_transformer_declared_factors_give_the_compression(tmp_path):
    assert video_compression(str(tmp_path), TRANSFORMER) == (8, 32)


def test_the_vae_config_states_the_compression_where_it_is_there(tmp_path):
    (tmp_path / "vae").mkdir()
    config = {"spatio_temporal_scaling": [True, True, True, True], "patch_size": 4, "patch_size_t": 1}
    (tmp_path / "vae" / "config.json").write_text(json.dumps(config))
    assert video_compression(str(tmp_path), TRANSFORMER) == (16, 64)  # diffusers' formula, no explicit ratios
    config |= {
        "spatial_compression_ratio": 32,
        "temporal_compression_ratio": 8,
    }  # as the released config states
    (tmp_path / "vae" / "config.json").write_text(json.dumps(config))
    assert video_compression(str(tmp_path), TRANSFORMER) == (8, 32)


def test_the_t2v_config_plans_121_frames_at_512x768_as_16x16x24_latents_and_1024_text_tokens():
    config = load_config(CONFIGS / "t2v.yaml", world_size=8)
    with torch.device("meta"):
        batch = planning_batch(
            SimpleNamespace(model=TRANSFORMER), config.data, 1, audio=False, frame_rate=24.0
        )
    assert tuple(batch["latents"].shape) == (1, 128, 16, 16, 24)
    assert (
        tuple(batch["prompt_embeds"].shape) == (1, 1024, 3840)
        and batch["prompt_embeds"].dtype == torch.bfloat16
    )
    assert "audio_latents" not in batch and batch["sample_ids"] == [0]


def test_a_23_or_25_transformer_plans_text_at_its_cross_attention_widths_for_both_streams():
    """No caption projection in the transformer (the connectors project per modality): video text
    ``cross_attention_dim`` wide, audio text ``audio_cross_attention_dim``, the audio's planned without audio too
    (the audio stream's placeholder tokens read it)."""
    config = load_config(CONFIGS / "t2v.yaml", world_size=8)
    release = SimpleNamespace(config=SimpleNamespace(
        **vars(TRANSFORMER.config), use_prompt_embeddings=False, cross_attention_dim=4096,
        audio_cross_attention_dim=2048,
    ))  # fmt: skip
    with torch.device("meta"):
        batch = planning_batch(SimpleNamespace(model=release), config.data, 1, audio=False, frame_rate=24.0)
    assert tuple(batch["prompt_embeds"].shape) == (1, 1024, 4096)
    assert tuple(batch["audio_prompt_embeds"].shape) == (1, 1024, 2048)


def test_an_ic_lora_run_plans_its_reference_clips_at_the_targets_shape():
    from ltx2_train.pipeline import LTX2Pipeline

    config = load_config(CONFIGS / "t2av.yaml", world_size=8)
    with torch.device("meta"):
        pipeline = LTX2Pipeline.from_options({"reference": "audio_video"})
        batch = pipeline.planning_batch(SimpleNamespace(model=TRANSFORMER), config.data, 1)
        video_only = LTX2Pipeline.from_options({"reference": "video"}).planning_batch(
            SimpleNamespace(model=TRANSFORMER), config.data, 1
        )
    assert batch["reference_latents"].shape == batch["latents"].shape == (1, 128, 16, 16, 24)
    assert batch["reference_audio_latents"].shape == batch["audio_latents"].shape
    assert "reference_latents" in video_only and "reference_audio_latents" not in video_only
