"""CachedVideoTextDataset: a cache of a VideoTextDataset gives the clip dataset's samples, epoch by epoch."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from mm_data import (
    CachedVideoTextDataset,
    VideoTextDataset,
    cache_dataset,
    caption_candidates,
    caption_entries,
)

TEXT_LEN = 12
CLIPS = {
    "num_frames": 9,
    "height": 16,
    "width": 16,
    "buckets": [[16, 16, 9], [16, 24, 9], [24, 16, 9]],
    "frame_offset": "start",
    "max_bad_fraction": 0.3,
}


def embed(text: str) -> torch.Tensor:
    """A stand-in text encoder: one row per word and one for the end token, a function of the text."""
    seed = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)
    return torch.randn(len(text.split()) + 1, 4, generator=torch.Generator().manual_seed(seed))


def latents(video: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.avg_pool3d(video[None], (1, 4, 4))[0]


def encoder(dataset: VideoTextDataset):
    def encode(item: dict) -> dict:
        caption = dataset.rows[int(item["index"])]["caption"]
        embeddings = [embed(text) for text in caption_candidates(caption)]
        return {"latents": latents(item["video"]), **caption_entries(caption, embeddings, TEXT_LEN)}

    return encode


def test_the_cache_gives_the_clip_datasets_samples_prompts_and_buckets_in_every_epoch(clips: Path, tmp_path):
    online = VideoTextDataset(clips, seed=5, caption_dropout=0.5, **CLIPS)
    cache_dataset(online, encoder(online), tmp_path, progress=False)
    cached = CachedVideoTextDataset(tmp_path, seed=5, caption_dropout=0.5, max_bad_fraction=0.3)

    assert cached.bucket_ids == online.bucket_ids and len(set(online.bucket_ids)) == 3
    prompts, skipped = set(), set()
    for epoch in range(3):
        online.set_epoch(epoch)
        cached.set_epoch(epoch)
        for i in range(len(online)):
            clip, item = online[i], cached[i]
            keys = ("index", "bucket", "skipped", "prompt")
            assert [item[k] for k in keys] == [clip[k] for k in keys], (epoch, i)
            assert torch.equal(item["latents"], latents(clip["video"]))
            want = torch.cat(
                [embed(clip["prompt"]), torch.zeros(TEXT_LEN - len(clip["prompt"].split()) - 1, 4)]
            )
            assert torch.equal(item["prompt_embeds"], want), (epoch, i)
            prompts.add(clip["prompt"])
            skipped.update(clip["skipped"])
    assert "" in prompts and len(prompts) > 4  # dropout and the caption lists were drawn from
    assert len(skipped) == 2  # the corrupt and the too-short clip: replaced in their buckets, as online


def test_an_unfinished_cache_is_refused_naming_the_missing_samples(clips: Path, tmp_path):
    online = VideoTextDataset(clips, **CLIPS)
    cache_dataset(online, encoder(online), tmp_path, rank=0, world_size=2, progress=False)
    with pytest.raises(FileNotFoundError, match=r"4 of 8 samples are not cached \(first: \[1, 3, 5, 7\]\)"):
        CachedVideoTextDataset(tmp_path)
