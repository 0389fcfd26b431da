"""`mm-data cache` and the per-sample file helpers."""

import sys
import textwrap
from pathlib import Path

import pytest
import torch
from mm_data import (
    PrecomputedLatentDataset,
    VideoTextDataset,
    build_dataloader,
    cache_dataset,
    load_precomputed,
    save_precomputed,
)
from mm_data.cli import main

ENCODER = """
import hashlib
import torch

def encode(item):
    latents = torch.nn.functional.avg_pool3d(item["video"][None], (1, 4, 4))[0]
    g = torch.Generator().manual_seed(int(hashlib.sha256(item["prompt"].encode()).hexdigest()[:8], 16))
    return {
        "latents": latents,
        "prompt_embeds": torch.randn(8, 16, generator=g),
        "prompt_attention_mask": torch.ones(8, dtype=torch.long),
        "metadata": {"encoder": "test", "prompt": item["prompt"]},
    }
"""
DATASET_KWARGS = {
    "num_frames": 9,
    "height": 16,
    "width": 16,
    "frame_offset": "start",
    "max_bad_fraction": 0.3,
}


@pytest.fixture
def encoder_module(tmp_path: Path, monkeypatch):
    """``toy_encoder:encode`` importable (the CLI imports ``--encoder``)."""
    (tmp_path / "toy_encoder.py").write_text(textwrap.dedent(ENCODER))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "toy_encoder:encode"
    sys.modules.pop("toy_encoder", None)


def test_the_cache_command_encodes_once_and_a_rerun_reuses_every_sample(
    clips: Path, tmp_path: Path, encoder_module, kinds_of, capsys
):
    args = ["cache", str(clips), "--out", str(tmp_path / "cache"), "--encoder", encoder_module, "--num-frames", "9",
            "--height", "16", "--width", "16", "--workers", "1", "--shard-size", "2", "--uses-prompt",
            "--dataset-kwargs", '{"max_bad_fraction": 0.3}']  # fmt: skip
    assert main(args) == 0
    good = [i for i, kind in enumerate(kinds_of(clips)) if kind == "clip"]
    printed = capsys.readouterr().out
    assert f"reused 0, computed {len(good)}, dropped 0, failed 2" in printed
    assert main(args) == 0
    assert f"reused {len(good)}, computed 0, dropped 0, failed 2" in capsys.readouterr().out

    precomputed = PrecomputedLatentDataset(tmp_path / "cache")
    dataset = VideoTextDataset(clips, **DATASET_KWARGS)
    encode = sys.modules["toy_encoder"].encode
    assert len(precomputed) == len(good)
    for item, row in zip(precomputed, good):
        expected = encode(dataset.sample(row))
        for key in ("latents", "prompt_embeds", "prompt_attention_mask"):
            assert torch.equal(item[key], expected[key]), (row, key)
        assert item["prompt"] == dataset.sample(row)["prompt"] and item["metadata"]["encoder"] == "test"


def test_more_than_one_rank_needs_a_process_group(clips: Path, tmp_path: Path):
    dataset = VideoTextDataset(clips, **DATASET_KWARGS)
    with pytest.raises(RuntimeError, match="world_size=2 needs torch.distributed initialized"):
        cache_dataset(dataset, lambda item: {}, tmp_path, identity={}, rank=0, world_size=2)


def test_precomputed_metadata_is_json_in_the_header(tmp_path: Path):
    save_precomputed(tmp_path / "a.safetensors", {"latents": torch.ones(2)}, {"prompt": "x", "fps": 16})
    tensors, metadata = load_precomputed(tmp_path / "a.safetensors")
    assert metadata == {"prompt": "x", "fps": 16} and torch.equal(tensors["latents"], torch.ones(2))
    with pytest.raises(KeyError, match="missing tensors"):
        PrecomputedLatentDataset(tmp_path)[0]


def test_precomputed_samples_batch_through_the_loader(clips: Path, tmp_path: Path, encoder_module):
    import toy_encoder

    dataset = VideoTextDataset(clips, **DATASET_KWARGS)
    cache_dataset(dataset, toy_encoder.encode, tmp_path, identity={}, num_workers=0, progress=False)
    precomputed = PrecomputedLatentDataset(tmp_path)
    loader = build_dataloader(precomputed, global_batch_size=2, dp_rank=0, dp_size=1, seed=0)
    batch = next(iter(loader))
    assert batch["latents"].shape[:2] == (2, 3) and batch["prompt_embeds"].shape == (2, 8, 16)
    assert len(batch["prompt"]) == 2 and batch["metadata"][0]["encoder"] == "test"
