import json
import math
from pathlib import Path

import pytest
from mm_data import Bucket, VideoTextDataset, assign_bucket, build_dataloader, make_buckets, parse_buckets

SQUARE, WIDE, TALL = (32, 32, 9), (32, 48, 9), (48, 32, 9)


def test_pixel_budget_buckets_respect_budget_multiple_and_ratio():
    buckets = make_buckets(480 * 832, 49, aspect_ratios=(9 / 16, 1.0, 16 / 9))
    assert len(buckets) == 3
    for ratio, b in zip((9 / 16, 1.0, 16 / 9), buckets):
        assert b.height * b.width <= 480 * 832 and b.height % 16 == 0 and b.width % 16 == 0
        assert abs(math.log(b.aspect / ratio)) < 0.05 and b.num_frames == 49


def test_parse_buckets_accepts_lists_dicts_and_budgets():
    assert parse_buckets([(32, 48), {"height": 16, "width": 16, "num_frames": 5}], 9) == [
        Bucket(32, 48, 9),
        Bucket(16, 16, 5),
    ]
    assert parse_buckets({"pixel_budget": 1024, "aspect_ratios": [1.0]}, 9) == [Bucket(32, 32, 9)]
    with pytest.raises(ValueError, match="unknown"):
        parse_buckets({"pixel_budget": 1024, "ratios": [1]}, 9)


def test_nearest_bucket_by_aspect_ratio_among_those_with_enough_frames():
    buckets = [Bucket(*SQUARE), Bucket(*WIDE), Bucket(*TALL), Bucket(32, 48, 17)]
    assert assign_bucket(64, 64, 40, buckets) == 0
    assert assign_bucket(48, 80, 40, buckets) == 3  # wide; the 17-frame bucket wins the tie
    assert assign_bucket(48, 80, 12, buckets) == 1  # only 12 frames: the 9-frame bucket
    assert assign_bucket(80, 48, None, buckets) == 2


def test_samples_go_to_their_bucket_and_batches_never_mix(clips: Path, kinds_of):
    ds = VideoTextDataset(
        clips, num_frames=9, height=32, width=32, buckets=[SQUARE, WIDE, TALL], max_bad_fraction=0.3
    )
    rows = json.loads(clips.read_text())
    expected = {(64, 64): 0, (48, 80): 1, (80, 48): 2}
    for i, row in enumerate(rows):
        assert ds.bucket_ids[i] == expected[(row["resolution"]["height"], row["resolution"]["width"])]
    loader = build_dataloader(ds, global_batch_size=2, dp_rank=0, dp_size=1, seed=0, drop_last=False)
    batches = list(loader)
    assert {b["bucket"].unique().numel() for b in batches} == {1}
    for b in batches:
        h, w, t = ds.buckets[int(b["bucket"][0])]
        assert b["video"].shape == (2, 3, t, h, w)
    assert {int(b["bucket"][0]) for b in batches} == {0, 1, 2}
