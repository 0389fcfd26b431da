"""The Wan video VAE as a frozen sub-model: diffusers ``AutoencoderKLWan`` with normalized latents, from a
diffusers ``vae/`` folder, the official ``Wan2.1_VAE.pth`` / ``Wan2.2_VAE.pth``, a ComfyUI VAE file, or a
release root holding one of them (:mod:`wan22_train.release`)."""

from __future__ import annotations

from typing import Any

import torch
from diffusers import AutoencoderKLWan
from mm_checkpoint import LoadReport, open_weights
from mm_trainer import BaseModel, load_module_weights, model_register
from torch import nn

from wan22_train.release import component_path, resolved_args, source_of, vae_keywords, vae_structure

VAE_KEY_MAPS = {False: "wan2_1_vae", True: "wan2_2_vae"}
"""mm-checkpoint's key map of the official VAE names, by ``is_residual`` (both pass diffusers keys through)."""


@model_register("wan_video_vae")
class WanVideoVAE(BaseModel, nn.Module):
    """``encode(video in [-1, 1]) -> normalized latents`` and ``decode`` back, always without grad.

    Latents are the posterior mean normalized with the config's ``latents_mean`` / ``latents_std``
    (what the Wan DiT is trained on). The VAE is never FSDP-wrapped (list it in ``ignored_modules``);
    weights load in ``from_pretrained`` (a diffusers folder), or in ``setup_weights`` after a build
    (official or ComfyUI names through the ``wan2_1_vae`` / ``wan2_2_vae`` key maps).
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
        source = component_path(source_of(args), "vae")
        if source is not None and (source / "config.json").is_file():
            return cls(AutoencoderKLWan.from_pretrained(source, **(args.config or {})))
        model = cls.build_from_config(args)
        model.setup_weights(args)
        return model

    @classmethod
    def build_from_config(cls, args: Any) -> WanVideoVAE:
        """Structure only: the source's ``config.json``; for a weights file (an official ``.pth``, a
        ComfyUI file) the official structure its names show (:func:`wan22_train.release.vae_structure`)
        updated by ``args.config``; without a source ``args.config`` alone (AutoencoderKLWan kwargs; a
        48-channel VAE without statistics takes the Wan2.2 release's: :func:`wan22_train.release.vae_keywords`)."""
        source = component_path(source_of(args), "vae")
        if source is not None and (source / "config.json").is_file():
            return cls(AutoencoderKLWan.from_config(AutoencoderKLWan.load_config(source)))
        if source is not None and source.is_file():
            with open_weights(source) as reader:
                keywords = vae_structure(reader.keys())
            return cls(AutoencoderKLWan(**(keywords | dict(args.config or {}))))
        return cls(AutoencoderKLWan(**vae_keywords(args.config)))

    def setup_weights(self, args: Any) -> LoadReport | None:
        """Load the VAE weights into ``self.vae`` (only when built by ``build_from_config``): diffusers
        keys as they are, official ones through ``wan2_1_vae`` / ``wan2_2_vae``."""
        if self.weights_loaded:
            return None  # from_pretrained loaded them already
        key_map = VAE_KEY_MAPS[bool(self.vae.config.is_residual)]
        report = load_module_weights(self.vae, resolved_args(args, "vae"), model_type=key_map)
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
