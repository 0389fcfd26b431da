"""Tiny toy sub-models and containers for the pipeline tests."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn


class ToyAE(nn.Module):
    """Causal-in-time toy VAE: frame 0 alone, then groups of 4 frames; spatial stride 2."""

    def __init__(self, latent_channels: int = 4) -> None:
        super().__init__()
        self.proj = nn.Conv3d(3, latent_channels, kernel_size=1)
        self.encode_calls = 0

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        self.encode_calls += 1
        b, c, f, h, w = video.shape
        rest = video[:, :, 1:].reshape(b, c, (f - 1) // 4, 4, h, w).mean(dim=3)
        frames = torch.cat([video[:, :, :1], rest], dim=2)
        pooled = F.avg_pool3d(frames, kernel_size=(1, 2, 2))
        return self.proj(pooled)


class ToyTextEncoder(nn.Module):
    """Embedding + linear, returning a transformers-like output with ``last_hidden_state``."""

    def __init__(self, vocab: int = 32, dim: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> SimpleNamespace:
        return SimpleNamespace(last_hidden_state=self.proj(self.embed(input_ids)))


class ToyPredictor(nn.Module):
    """Velocity predictor using all three inputs: latents, timestep and text."""

    def __init__(self, in_channels: int = 4, out_channels: int = 4, text_dim: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size=1)
        self.time = nn.Linear(1, out_channels)
        self.text = nn.Linear(text_dim, out_channels)

    def forward(
        self, hidden_states: torch.Tensor, timestep: torch.Tensor, encoder_hidden_states: torch.Tensor
    ):
        bias = self.time(timestep.float().reshape(-1, 1) / 1000) + self.text(
            encoder_hidden_states.mean(dim=1)
        )
        return self.conv(hidden_states) + bias[:, :, None, None, None]


class ToyContainer(nn.Module):
    """Sub-models as attributes; ae and text encoder frozen by ``requires_grad_(False)``."""

    def __init__(self, latent_channels: int = 4, predictor_in: int | None = None) -> None:
        super().__init__()
        self.ae = ToyAE(latent_channels).requires_grad_(False)
        self.text_encoder = ToyTextEncoder().requires_grad_(False)
        self.predictor = ToyPredictor(predictor_in or latent_channels, latent_channels)


class DeclaredContainer(ToyContainer):
    """Container that declares trainability itself (all params keep ``requires_grad=True``)."""

    def __init__(self, trainable: tuple[str, ...] = ("predictor",)) -> None:
        super().__init__()
        self.requires_grad_(True)
        self.trainable = trainable

    def is_trainable(self, role: str) -> bool:
        return role in self.trainable


def make_batch(batch_size: int = 2, frames: int = 9, size: int = 8, seq: int = 5, seed: int = 0) -> dict:
    """Video ``[B, 3, frames, size, size]`` in [-1, 1] plus token ids and a padded mask."""
    g = torch.Generator().manual_seed(seed)
    video = torch.rand(batch_size, 3, frames, size, size, generator=g) * 2 - 1
    input_ids = torch.randint(0, 32, (batch_size, seq), generator=g)
    attention_mask = torch.ones(batch_size, seq, dtype=torch.long)
    attention_mask[:, -2:] = 0
    return {"video": video, "input_ids": input_ids, "attention_mask": attention_mask}


@pytest.fixture
def batch() -> dict:
    return make_batch()


@pytest.fixture
def toys() -> SimpleNamespace:
    """The toy classes and batch factory (test files cannot import conftest by name)."""
    return SimpleNamespace(
        AE=ToyAE,
        TextEncoder=ToyTextEncoder,
        Predictor=ToyPredictor,
        Container=ToyContainer,
        DeclaredContainer=DeclaredContainer,
        make_batch=make_batch,
    )
