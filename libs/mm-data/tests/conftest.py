"""Shared fixtures: real mp4 datasets written once per session by the synthetic generator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mm_data import make_synthetic_dataset


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
