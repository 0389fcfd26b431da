"""Shared test helpers for mm-parallel: a tiny 3-sub-model container and its batches.

The container mirrors the shape of a video-diffusion container: a frozen ``ae``
(encodes "video" to latents), a frozen ``text_encoder`` and a trainable
``predictor`` with ``blocks``. It opts out of the root FSDP wrap.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

DIM = 8
VIDEO_CHANNELS = 4
VOCAB = 16

TOY_PLAN = {
    "apply_modules": ["text_encoder", "predictor.blocks.{*}", "predictor.head"],
    "ignored_modules": ["ae"],
}


class FreshLinear(nn.Linear):
    """``nn.Linear`` whose output is a tensor of its own. ``nn.Linear`` on ``[B, S, C]`` returns a view of
    its 2-D matmul; as the last layer of an FSDP2 unit that is torch's "returned a view tensor" hazard."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T + self.bias


class ToyAE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = FreshLinear(VIDEO_CHANNELS, DIM)

    def forward(self, video: torch.Tensor) -> torch.Tensor:
        return self.encoder(video)


class ToyTextEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(nn.Linear(DIM, DIM) for _ in range(2))
        self.norm = nn.LayerNorm(DIM)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = x + torch.tanh(layer(x))
        return self.norm(x)


class ToyBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))
        self.context = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x)) + self.context(text.mean(1, keepdim=True))


class ToyPredictor(nn.Module):
    def __init__(self, num_blocks: int = 3) -> None:
        super().__init__()
        self.in_proj = nn.Linear(DIM, DIM)
        self.blocks = nn.ModuleList(ToyBlock() for _ in range(num_blocks))
        self.head = FreshLinear(DIM, DIM)

    def forward(self, x: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        h = self.in_proj(x)
        for block in self.blocks:
            h = block(h, text)
        return self.head(h)


def _trains(module: nn.Module) -> bool:
    return torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters())


class ToyContainer(nn.Module):
    """Frozen ae + frozen text_encoder + trainable predictor; forward returns the loss."""

    _fsdp_skip_root_wrap = True

    def __init__(self) -> None:
        super().__init__()
        self.ae = ToyAE()
        self.text_encoder = ToyTextEncoder()
        self.predictor = ToyPredictor()

    def forward(self, video: torch.Tensor, prompt_ids: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        # conditions are computed without autograd unless a test makes that sub-model trainable
        with torch.set_grad_enabled(_trains(self.ae)):
            latents = self.ae(video)
        with torch.set_grad_enabled(_trains(self.text_encoder)):
            text = self.text_encoder(prompt_ids)
        pred = self.predictor(latents + noise, text)
        return F.mse_loss(pred.float(), (noise - latents).float())


def make_container(seed: int = 0, trainable: tuple[str, ...] = ("predictor",)) -> ToyContainer:
    """A deterministic container; sub-models not in ``trainable`` are frozen."""
    torch.manual_seed(seed)
    model = ToyContainer()
    for name, child in model.named_children():
        child.requires_grad_(name in trainable)
    return model


def make_batch(batch_size: int, seed: int = 0, frames: int = 4, text_len: int = 5) -> dict[str, torch.Tensor]:
    """A deterministic global batch for :class:`ToyContainer`."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "video": torch.randn(batch_size, frames, VIDEO_CHANNELS, generator=gen),
        "prompt_ids": torch.randint(0, VOCAB, (batch_size, text_len), generator=gen),
        "noise": torch.randn(batch_size, frames, DIM, generator=gen),
    }


def shard_batch(batch: dict[str, torch.Tensor], rank: int, world_size: int) -> dict[str, torch.Tensor]:
    """This rank's contiguous slice of a global batch."""
    return {k: v.chunk(world_size)[rank] for k, v in batch.items()}


def to_numpy(tree: dict[str, torch.Tensor]) -> dict[str, object]:
    """Tensors -> numpy arrays, so results can leave a worker process (torch tensors are sent as
    shared-memory file descriptors, which die with the worker)."""
    return {k: v.detach().cpu().numpy() for k, v in tree.items()}


@pytest.fixture
def toy() -> SimpleNamespace:
    """Toy container helpers: ``make_container``, ``make_batch``, ``shard_batch``, ``to_numpy``, ``plan`` (dict)."""
    return SimpleNamespace(
        make_container=make_container,
        make_batch=make_batch,
        shard_batch=shard_batch,
        to_numpy=to_numpy,
        plan=lambda **overrides: {**TOY_PLAN, **overrides},
    )
