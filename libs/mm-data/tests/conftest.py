"""Shared fixtures: real mp4 datasets written once per session by the synthetic generator."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from mm_data import caption_candidates, caption_entries, make_synthetic_dataset

TEXT_LEN = 12


@pytest.fixture(scope="session")
def clips(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """6 good clips (sizes 64x64, 48x80, 80x48; fps 16/8/12; 33/25/17 frames), 1 corrupt, 1 too short."""
    return make_synthetic_dataset(tmp_path_factory.mktemp("clips"), num_clips=6, corrupt=1, too_short=1)


@pytest.fixture(scope="session")
def index_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 64x64, 16 fps, 41-frame clip whose frame k is the solid colour ``index_colour_rgb(k)``."""
    return make_synthetic_dataset(
        tmp_path_factory.mktemp("index"),
        num_clips=1,
        sizes=[(64, 64)],
        fps=16,
        num_frames=41,
        index_colour=True,
    )


def kinds(metadata: Path) -> list[str]:
    """The ``kind`` column of a synthetic metadata file."""
    return [row["kind"] for row in json.loads(metadata.read_text())]


@pytest.fixture
def kinds_of():
    return kinds


def embed(text: str) -> torch.Tensor:
    """A stand-in text encoder: one row per word and one for the end token, a function of the text."""
    seed = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)
    return torch.randn(len(text.split()) + 1, 4, generator=torch.Generator().manual_seed(seed))


def pooled(video: torch.Tensor) -> torch.Tensor:
    """A stand-in VAE: 4x4 average pooling of the frames."""
    return torch.nn.functional.avg_pool3d(video[None], (1, 4, 4))[0]


def toy_encoder(dataset):
    """``encode(item)`` for ``mm_data.cache_dataset``: pooled video + the embeddings of every caption of
    the row, zero-padded to ``TEXT_LEN`` at train time (a function of the clip and the row only)."""

    def encode(item: dict) -> dict:
        caption = dataset.rows[int(item["index"])]["caption"]
        embeddings = [embed(text) for text in caption_candidates(caption)]
        return {"latents": pooled(item["video"]), **caption_entries(caption, embeddings, TEXT_LEN)}

    return encode


@pytest.fixture
def toy():
    """The toy cache encoder: ``toy.encoder(dataset)``, ``toy.embed(text)``, ``toy.pooled(video)``,
    ``toy.text_len``."""
    return SimpleNamespace(encoder=toy_encoder, embed=embed, pooled=pooled, text_len=TEXT_LEN)
