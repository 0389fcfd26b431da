"""``wan22-train preprocess``'s VAE tiling: clips larger than the tile encode in tiles, smaller ones as before."""

from __future__ import annotations

import torch
from mm_trainer import enable_vae_tiling
from wan22_train.tiny import tiny_vae


def test_vae_tiling_tiles_only_clips_larger_than_the_tile():
    torch.manual_seed(0)
    vae = tiny_vae().eval()
    video = torch.rand(1, 3, 1, 32, 32, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with torch.no_grad():
        whole = vae.encode(video).latent_dist.mode()
        enable_vae_tiling(vae, 32)
        assert vae.use_tiling and torch.equal(vae.encode(video).latent_dist.mode(), whole)  # fits one tile
        enable_vae_tiling(vae, 16)
        tiled = vae.encode(video).latent_dist.mode()
    assert tiled.shape == whole.shape and not torch.equal(tiled, whole)
    assert (tiled - whole).abs().mean() < 0.5 * whole.abs().mean()  # the same picture, seams blended
