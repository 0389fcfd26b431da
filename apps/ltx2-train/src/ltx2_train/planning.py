"""A micro-batch of an LTX-2 run's real shapes, for ``mm-train plan`` (the pipeline's ``planning_batch``).

What ``ltx2_precomputed`` yields for ``data.dataset.preprocess``'s clips: ``latents [B, C, F', H', W']``
(F' = 1 + (F - 1) / t, H' = H / s, W' = W / s, with the video VAE's compression from
``model_root/vae/config.json`` when it is there, else the transformer's ``vae_scale_factors``: 8 x 32 x 32; C = the
transformer's ``in_channels`` over its patch volume), ``prompt_embeds`` (and, with audio,
``audio_prompt_embeds``) ``[B, max_sequence_length, D]`` in the preprocess dtype (D: the widths
the transformer's release takes, :func:`ltx2_train.release_inputs.text_widths`: ``caption_channels`` for
2.0; ``cross_attention_dim`` / ``audio_cross_attention_dim`` for 2.3 and 2.5),
``prompt_attention_mask [B, max_sequence_length]``, and with audio ``audio_latents [B, C_a, L, M]``
(L = the clip's seconds x sample rate / hop / 4, as upstream's pipeline counts them; ``C_a x M`` =
the transformer's ``audio_in_channels``, M = mel bins / 4).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderKLLTX2Audio
from diffusers.models.autoencoders.autoencoder_kl_ltx2_audio import LATENT_DOWNSAMPLE_FACTOR
from mm_parallel import parse_dtype

from ltx2_train.config_schema import PreprocessOptions
from ltx2_train.release_inputs import text_widths
from ltx2_train.vae_factors import video_vae_factors

AUDIO_LATENT_DOWNSAMPLE = LATENT_DOWNSAMPLE_FACTOR
"""Upstream's audio VAE compresses time and mel bins by this (4): a constant of its module, not a config field."""


def _vae_config(root: str, name: str, cls: Any) -> dict[str, Any]:
    """The VAE's config: its ``config.json`` under ``root/name`` when present, the class defaults otherwise."""
    path = Path(root) / name / "config.json"
    defaults = {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items() if k != "self"}
    return {**defaults, **(json.loads(path.read_text()) if path.is_file() else {})}


def video_compression(model_root: str, transformer: Any) -> tuple[int, int]:
    """``(temporal, spatial)`` compression of the video VAE: its ``config.json`` where it is there
    (:func:`ltx2_train.vae_factors.video_vae_factors`), else the factors the transformer declares for its
    RoPE grid (``vae_scale_factors``: upstream's 8, 32, 32)."""
    factors = video_vae_factors(model_root)
    if factors is not None:
        return factors
    temporal, spatial, _ = transformer.config.vae_scale_factors
    return int(temporal), int(spatial)


def audio_shape(options: PreprocessOptions, transformer: Any, frame_rate: float) -> tuple[int, int, int]:
    """``(channels, latent frames, latent mel bins)`` of one clip's audio latents."""
    cfg = _vae_config(options.model_root, "audio_vae", AutoencoderKLLTX2Audio)
    mel = int(cfg["mel_bins"]) // AUDIO_LATENT_DOWNSAMPLE
    seconds = options.num_frames / frame_rate
    frames = round(seconds * int(cfg["sample_rate"]) / int(cfg["mel_hop_length"]) / AUDIO_LATENT_DOWNSAMPLE)
    return int(transformer.config.audio_in_channels) // mel, max(1, frames), mel


def planning_batch(
    container: Any, data: Any, micro_batch_size: int, *, audio: bool, frame_rate: float
) -> dict[str, Any]:
    """One micro-batch of the run's real shapes with ``sample_ids`` (see the module docstring)."""
    options = PreprocessOptions(**(dict(data.dataset or {}).get("preprocess") or {}))
    transformer = container.model
    temporal, spatial = video_compression(options.model_root, transformer)
    patch = int(transformer.config.patch_size) ** 2 * int(transformer.config.patch_size_t)
    channels = int(transformer.config.in_channels) // patch
    grid = (1 + (options.num_frames - 1) // temporal, options.height // spatial, options.width // spatial)
    size, length = micro_batch_size, options.max_sequence_length
    width, audio_width = text_widths(transformer.config)
    dtype = parse_dtype(options.dtype, key="data.dataset.preprocess.dtype") or torch.float32
    batch: dict[str, Any] = {
        "latents": torch.zeros(size, channels, *grid, dtype=dtype),
        "prompt_embeds": torch.zeros(size, length, width, dtype=dtype),
        "prompt_attention_mask": torch.ones(size, length, dtype=torch.long),
        "sample_ids": list(range(size)),
    }
    if (
        audio or audio_width != width
    ):  # preprocess writes both; the audio stream reads its own without audio too
        batch["audio_prompt_embeds"] = torch.zeros(size, length, audio_width, dtype=dtype)
    if audio:
        rate = float(options.fps or frame_rate)
        batch["audio_latents"] = torch.zeros(size, *audio_shape(options, transformer, rate), dtype=dtype)
    return batch
