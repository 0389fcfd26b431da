"""CachedVideoTextDataset: a cache of a VideoTextDataset gives the clip dataset's samples, epoch by epoch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mm_data import (
    CachedVideoTextDataset,
    VideoTextDataset,
    bad_marker_name,
    cache_dataset,
    cache_file_name,
    write_per_file_copy,
)

CLIPS = {
    "num_frames": 9,
    "height": 16,
    "width": 16,
    "buckets": [[16, 16, 9], [16, 24, 9], [24, 16, 9]],
    "frame_offset": "start",
    "max_bad_fraction": 0.3,
}

IDENTITY = {"encoder": "toy"}


def test_the_cache_gives_the_clip_datasets_samples_prompts_and_buckets_in_every_epoch(
    clips: Path, tmp_path, toy
):
    online = VideoTextDataset(clips, seed=5, caption_dropout=0.5, **CLIPS)
    cache_dataset(online, toy.encoder(online), tmp_path, identity=IDENTITY, num_workers=0, progress=False)
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
            assert torch.equal(item["latents"], toy.pooled(clip["video"]))
            want = torch.cat(
                [toy.embed(clip["prompt"]), torch.zeros(toy.text_len - len(clip["prompt"].split()) - 1, 4)]
            )
            assert torch.equal(item["prompt_embeds"], want), (epoch, i)
            prompts.add(clip["prompt"])
            skipped.update(clip["skipped"])
    assert "" in prompts and len(prompts) > 4  # dropout and the caption lists were drawn from
    assert len(skipped) == 2  # the corrupt and the too-short clip: replaced in their buckets, as online


def test_a_per_file_cache_of_earlier_versions_reads_as_the_sharded_one(clips: Path, tmp_path, toy):
    online = VideoTextDataset(clips, seed=5, caption_dropout=0.5, **CLIPS)
    cache_dataset(
        online, toy.encoder(online), tmp_path / "sharded", identity=IDENTITY, num_workers=0, progress=False
    )
    per_file = write_per_file_copy(tmp_path / "sharded", tmp_path / "per_file")
    assert not (per_file / "index.json").exists() and len(list(per_file.glob("*.safetensors"))) == 6
    sharded, legacy = (CachedVideoTextDataset(p, seed=5, caption_dropout=0.5, max_bad_fraction=0.3)
                       for p in (tmp_path / "sharded", per_file))  # fmt: skip
    assert legacy.bucket_ids == sharded.bucket_ids
    for i in range(len(online)):
        a, b = sharded[i], legacy[i]
        assert a.keys() == b.keys() and all(
            torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a
        ), i


def test_an_unfinished_per_file_cache_is_refused_naming_the_missing_samples(clips: Path, tmp_path, toy):
    online = VideoTextDataset(clips, **CLIPS)
    cache_dataset(
        online, toy.encoder(online), tmp_path / "sharded", identity=IDENTITY, num_workers=0, progress=False
    )
    per_file = write_per_file_copy(tmp_path / "sharded", tmp_path / "per_file")
    for row in (1, 3):
        (per_file / cache_file_name(row)).unlink(missing_ok=True)
        (per_file / bad_marker_name(row)).unlink(missing_ok=True)
    with pytest.raises(FileNotFoundError, match=r"2 of 8 samples are not cached \(first: \[1, 3\]\)"):
        CachedVideoTextDataset(per_file)
