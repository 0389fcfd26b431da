"""``ConcatSources``: several data sets as one epoch, each sample held its source's repeats, read by the
bucketed and the packed samplers."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from mm_data import (
    Bucket,
    ConcatSources,
    GlobalOrderSampler,
    TokenBalancedSampler,
    VideoTextDataset,
    build_dataloader,
)
from PIL import Image


class Rows:
    """A dataset of named rows whose items say which row and epoch they were read at."""

    def __init__(self, name: str, n: int, *, bad: frozenset[int] = frozenset()) -> None:
        self.rows = [{"path": f"{name}{i}"} for i in range(n)]
        self.epoch, self.bad = 0, bad

    def __len__(self) -> int:
        return len(self.rows)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __getitem__(self, row: int) -> dict:
        skipped = [row] if row in self.bad else []
        read = (row + 1) % len(self) if skipped else row
        return {"path": self.rows[read]["path"], "epoch": self.epoch, "index": read, "skipped": skipped}


def images(folder, sizes: list[tuple[int, int]]) -> VideoTextDataset:
    """A caption folder of real PNGs (one-frame samples), one per ``(height, width)``."""
    folder.mkdir()
    for i, (h, w) in enumerate(sizes):
        Image.fromarray(np.full((h, w, 3), 40 * i, np.uint8)).save(folder / f"img{i}.png")
        (folder / f"img{i}.txt").write_text(f"image {i}")
    buckets = [[32, 32, 1], [32, 48, 1]]
    return VideoTextDataset(folder, num_frames=1, height=32, width=32, frame_rule=None, buckets=buckets)


def test_an_epoch_holds_each_sources_samples_its_repeats_times():
    """Sources that state no buckets keep to their own global batches (their shapes may differ)."""
    data = ConcatSources([Rows("a", 3), Rows("b", 2)], [2, 1])
    sampler = GlobalOrderSampler(data, global_batch_size=2, dp_rank=0, dp_size=1, seed=5)
    epoch = sampler.global_batches(0)
    assert len(data) == 8 and sum(len(b) for b in epoch) == 8
    assert all(len({data.locate(i)[0] for i in batch}) == 1 for batch in epoch)
    seen = Counter(data[i]["path"] for batch in epoch for i in batch)
    assert seen == {"a0": 2, "a1": 2, "a2": 2, "b0": 1, "b1": 1}
    assert [data.locate(i) for i in (0, 3, 5, 6, 7)] == [
        (0, 0, 0),
        (0, 1, 0),
        (0, 1, 2),
        (1, 0, 0),
        (1, 0, 1),
    ]


def test_each_repeat_reads_its_source_at_its_own_epoch_and_one_repeat_at_the_runs():
    """Repeat ``k`` of epoch ``e`` draws at source epoch ``e x repeats + k``: its own frame window and caption;
    a source of ``repeats: 1`` draws what the dataset alone draws."""
    data = ConcatSources([Rows("a", 2), Rows("b", 1)], [3, 1])
    data.set_epoch(2)
    assert [data[i]["epoch"] for i in range(len(data))] == [6, 6, 7, 7, 8, 8, 2]


def test_the_packed_epoch_holds_the_repeats_in_the_order_of_the_step_and_data_alone():
    data = ConcatSources([Rows("a", 3), Rows("b", 2)], [2, 1])
    tokens = [64 if data.locate(i)[0] == 0 else 16 for i in range(len(data))]

    def epoch(dp_size: int) -> list[list[int]]:
        samplers = [
            TokenBalancedSampler(
                tokens, global_batch_size=4, dp_rank=r, dp_size=dp_size, token_budget=128, seed=1
            )
            for r in range(dp_size)
        ]
        return [sorted(i for s in samplers for micro in s.plan(0, step).rank(s.dp_rank) for i in micro)
                for step in range(2)]  # fmt: skip

    steps = epoch(1)
    assert steps == epoch(2)
    assert Counter(data[i]["path"] for step in steps for i in step) == {
        "a0": 2,
        "a1": 2,
        "a2": 2,
        "b0": 1,
        "b1": 1,
    }


def test_a_resumed_loader_continues_with_the_uninterrupted_samples():
    data = ConcatSources([Rows("a", 3), Rows("b", 3)], [2, 2])
    whole = build_dataloader(data, global_batch_size=2, dp_rank=0, dp_size=1, seed=2, collate_fn=list)
    paths = [[item["path"] for item in batch] for batch in whole]
    first = build_dataloader(data, global_batch_size=2, dp_rank=0, dp_size=1, seed=2, collate_fn=list)
    it = iter(first)
    for _ in range(3):
        next(it)
    resumed = build_dataloader(data, global_batch_size=2, dp_rank=0, dp_size=1, seed=2, collate_fn=list)
    resumed.load_state_dict(first.state_dict())
    assert [[item["path"] for item in batch] for batch in resumed] == paths[3:]


def test_index_and_skipped_count_rows_over_the_sources_without_repeats():
    """A bad row is the same row in every repeat: counted once against the sources' summed limit."""
    data = ConcatSources([Rows("a", 2), Rows("b", 3, bad=frozenset({1}))], [3, 2])
    b1_first, b1_second = 6 + 1, 6 + 3 + 1
    assert data[b1_first]["skipped"] == data[b1_second]["skipped"] == [2 + 1]
    assert data[b1_first]["index"] == 2 + 2
    assert data.rows[b1_second] == {"path": "b1"}


def test_buckets_of_one_shape_join_across_sources(tmp_path):
    """Images of one size from two folders share a bucket; the joined buckets are the sizes."""
    wide = images(tmp_path / "wide", [(32, 48), (32, 32)])
    square = images(tmp_path / "square", [(32, 32)])
    data = ConcatSources([wide, square], [1, 2])
    assert data.buckets == [Bucket(32, 48, 1), Bucket(32, 32, 1)]
    assert data.bucket_ids == [0, 1, 1, 1]
    assert [data[i]["bucket"] for i in range(4)] == [0, 1, 1, 1]
    assert data[3]["video"].shape == (3, 1, 32, 32)
    assert data.bad_sample_limit == pytest.approx(0.05 * 3)
