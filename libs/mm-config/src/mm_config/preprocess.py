"""``data.dataset.preprocess.run``: how an app's ``preprocess`` command writes the latent cache.

Both apps (``wan22-train preprocess``, ``ltx2-train preprocess``) take this section under their own
``preprocess`` options; it says how the work runs, not what is encoded (``mm_data.cache_dataset``
hashes what is encoded into every sample's key, and ``vae_tiling`` / ``vae_tile`` too, since tiled
encoding changes the latents).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import ConfigModel

__all__ = ["PreprocessRunConfig"]


class PreprocessRunConfig(ConfigModel):
    """``data.dataset.preprocess.run``: shards, decode workers, text encoder sharding, VAE tiling."""

    shard_size: int = Field(default=64, ge=1)
    """Samples per cache shard file (on average: shards are cut where the samples' keys say, so a change
    rewrites one shard); a training step opens a file only when it reaches a shard not yet open."""
    decode_workers: int = Field(default=2, ge=0)
    """DataLoader worker processes decoding clips on each rank while the encoders run; 0 decodes in the
    main process, between encoder calls."""
    prefetch: int = Field(default=2, ge=1)
    """Decoded clips each decode worker keeps ready: at most ``decode_workers x prefetch`` clips wait in
    memory."""
    text_encoder_fsdp: bool | Literal["auto"] = "auto"
    """Shard the text encoder over the ranks with FSDP2 (each rank holds 1/world of it; every rank then
    encodes in lockstep): true, false, or ``auto``: true when there is more than one rank and the
    encoder's weight files exceed 4 GiB (UMT5-XXL, Gemma-3)."""
    vae_tiling: bool = False
    """Encode clips larger than ``vae_tile`` in overlapping spatial tiles (diffusers' ``enable_tiling``):
    bounded VAE memory at high resolutions; the latents differ slightly from an untiled encode."""
    vae_tile: int | None = Field(default=None, ge=16)
    """Tile size in pixels (height and width; tiles overlap by a quarter); None: the VAE's default
    (Wan: 256, LTX-2: 512). Only with ``vae_tiling``."""
