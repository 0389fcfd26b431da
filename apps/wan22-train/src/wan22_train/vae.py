"""The Wan video VAE as a frozen sub-model: diffusers ``AutoencoderKLWan`` with normalized latents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderKLWan
from mm_checkpoint import LoadReport
from mm_trainer import BaseModel, load_module_weights, model_register
from torch import nn


@model_register("wan_video_vae")
class WanVideoVAE(BaseModel, nn.Module):
    """``encode(video in [-1, 1]) -> normalized latents`` and ``decode`` back, always without grad.

    Latents are the posterior mean normalized with the config's ``latents_mean`` / ``latents_std``
    (what the Wan DiT is trained on). The VAE is never FSDP-wrapped (list it in ``ignored_modules``);
    weights load in ``from_pretrained`` (diffusers), or in ``setup_weights`` after a meta build.
    """

    def __init__(self, vae: AutoencoderKLWan) -> None:
        super().__init__()
        self.vae = vae

    def _stats(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        # From the config each call (not buffers: a meta-built module would lose them in to_empty).
        cfg = self.vae.config
        shape = (1, cfg.z_dim, 1, 1, 1)
        mean = torch.tensor(cfg.latents_mean, device=device).view(shape)
        return mean, torch.tensor(cfg.latents_std, device=device).view(shape)

    @classmethod
    def from_pretrained(cls, args: Any) -> WanVideoVAE:
        return cls(AutoencoderKLWan.from_pretrained(args.from_pretrained, **(args.config or {})))

    @classmethod
    def build_from_config(cls, args: Any) -> WanVideoVAE:
        """Structure only: the source's ``config.json``, else ``args.config`` (AutoencoderKLWan kwargs)."""
        source = Path(args.from_pretrained or "")
        if (source / "config.json").is_file():
            return cls(AutoencoderKLWan.from_config(AutoencoderKLWan.load_config(source)))
        return cls(AutoencoderKLWan(**(args.config or {})))

    def setup_weights(self, args: Any) -> LoadReport | None:
        """Load the diffusers VAE weights into ``self.vae`` (only when built by ``build_from_config``)."""
        if self.weights_loaded:
            return None  # from_pretrained loaded them already
        report = load_module_weights(self.vae, args)
        if report is not None:
            self.weights_loaded = True
        return report

    @property
    def temporal_compression(self) -> int:
        return int(self.vae.config.scale_factor_temporal)

    @property
    def spatial_compression(self) -> int:
        return int(self.vae.config.scale_factor_spatial)

    @torch.no_grad()
    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """video [B, 3, F, H, W] in [-1, 1] -> latents [B, z, 1 + (F-1)/t, H/s, W/s] (normalized, fp32)."""
        dtype = next(self.vae.parameters()).dtype
        posterior_mean = self.vae.encode(video.to(dtype)).latent_dist.mode()
        mean, std = self._stats(video.device)
        return (posterior_mean.float() - mean) / std

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalized latents -> video [B, 3, F, H, W] in [-1, 1]."""
        dtype = next(self.vae.parameters()).dtype
        mean, std = self._stats(latents.device)
        raw = latents.float() * std + mean
        return self.vae.decode(raw.to(dtype)).sample.float().clamp(-1, 1)

    def forward(self, video: torch.Tensor) -> torch.Tensor:
        return self.encode(video)
