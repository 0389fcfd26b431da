"""Decoding LTX-2 video latents to frames: ``ltx2-train sample``'s clips and a reward fine-tuning's rollouts
(``LTX2Container.decode_latents``, for the rewards that score frames).

The cache holds latents normalised with the video VAE's statistics (``(z - mean) * scaling_factor / std``);
decoding undoes that and runs the VAE's decoder, to ``[N, 3, F, H, W]`` in ``[-1, 1]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderKLLTX2Video

from ltx2_train.release_file import load_release_encoders


@torch.no_grad()
def decode_video(vae: AutoencoderKLLTX2Video, latents: torch.Tensor) -> torch.Tensor:
    """Frames ``[N, 3, F, H, W]`` (fp32, in ``[-1, 1]``) of normalised video latents ``[N, C, F', H', W']``,
    one clip at a time (a batch of rollouts need not fit the decoder's activations at once)."""
    mean, std = (x.view(1, -1, 1, 1, 1) for x in (vae.latents_mean, vae.latents_std))
    raw = latents.to(mean.device) * std / vae.config.scaling_factor + mean
    clips = [vae.decode(clip[None].to(vae.dtype)).sample for clip in raw]
    return torch.cat(clips).float().clamp(-1, 1)


def load_video_vae(
    options: Any, device: torch.device, dtype: torch.dtype, *, planned: bool = False
) -> AutoencoderKLLTX2Video:
    """The video VAE the cache was encoded with (``data.dataset.preprocess``: ``model_root``'s ``vae/``, or
    the ``release_file``'s weights), frozen, in eval mode on ``device``; ``planned``: its architecture from
    ``vae/config.json`` on meta (no weights read: the planner materializes it)."""
    root = Path(options.model_root)
    if planned:
        with torch.device("meta"):
            vae = AutoencoderKLLTX2Video.from_config(AutoencoderKLLTX2Video.load_config(root / "vae"))
        return vae.to(dtype).eval().requires_grad_(False)
    if options.release_file:
        vae = load_release_encoders(options.release_file, root, audio=False, dtype=dtype)[0]
    else:
        if not (root / "vae").is_dir():
            raise FileNotFoundError(f"data.dataset.preprocess.model_root={root}: missing ['vae']")
        vae = AutoencoderKLLTX2Video.from_pretrained(root / "vae", torch_dtype=dtype)
    return vae.to(device=device).eval().requires_grad_(False)


__all__ = ["decode_video", "load_video_vae"]
