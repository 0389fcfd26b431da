"""Fixtures for WanDiT tests: tiny random-weight diffusers `WanTransformer3DModel`s saved to disk, and inputs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

# Tiny but non-trivial: 2 blocks, 4 heads of 16 channels (RoPE split 8/4/4), qk + cross-attention norms.
TINY_DIFFUSERS = {
    "patch_size": [1, 2, 2],
    "num_attention_heads": 4,
    "attention_head_dim": 16,
    "in_channels": 16,
    "out_channels": 16,
    "text_dim": 24,
    "freq_dim": 32,
    "ffn_dim": 96,
    "num_layers": 2,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "eps": 1e-6,
    "rope_max_seq_len": 64,
}
KINDS = {
    "t2v": {},
    "i2v": {"in_channels": 36},  # 16 noise + 4 mask + 16 image latents (Wan2.2 I2V-A14B layout)
    "ti2v": {"in_channels": 48, "out_channels": 48},  # Wan2.2 VAE latents (TI2V-5B layout)
}
LATENT_FHW = (3, 8, 12)  # post-patch grid 3 x 4 x 6: non-cubic, 72 tokens
TEXT_LEN = 7


def tiny_diffusers_config(kind: str, **overrides) -> dict:
    """The tiny diffusers config.json dict of one model kind."""
    return {**TINY_DIFFUSERS, **KINDS[kind], **overrides}


@pytest.fixture
def diffusers_wan(tmp_path: Path) -> Callable[..., tuple[torch.nn.Module, Path]]:
    """Factory `(kind, **config_overrides) -> (diffusers model in eval mode, folder it was saved to)`.

    Every parameter (norm weights, biases, modulation tables included) is perturbed with randn so no
    term is trivially zero or one; the model is saved with `save_pretrained` (sharded on request).
    """
    from diffusers import WanTransformer3DModel

    def make(kind: str = "t2v", *, seed: int = 0, max_shard_size: str | None = None, **overrides):
        torch.manual_seed(seed)
        model = WanTransformer3DModel(**tiny_diffusers_config(kind, **overrides)).eval()
        with torch.no_grad():
            for param in model.parameters():
                param.add_(0.2 * torch.randn_like(param))
        folder = tmp_path / f"diffusers_{kind}_{seed}"
        kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
        model.save_pretrained(folder, **kwargs)
        return model, folder

    return make


@pytest.fixture
def wan_inputs() -> Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Factory `(in_channels, batch=2, seed=1) -> (hidden_states, timestep [B], encoder_hidden_states)`."""

    def make(in_channels: int, batch: int = 2, seed: int = 1):
        gen = torch.Generator().manual_seed(seed)
        hidden = torch.randn(batch, in_channels, *LATENT_FHW, generator=gen)
        timestep = torch.tensor([999.0, 312.5, 3.0, 640.0][:batch])
        text = torch.randn(batch, TEXT_LEN, TINY_DIFFUSERS["text_dim"], generator=gen)
        return hidden, timestep, text

    return make
