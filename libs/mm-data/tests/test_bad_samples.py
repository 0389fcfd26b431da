import logging
from pathlib import Path

import pytest
from mm_data import BadSampleError, VideoTextDataset, build_dataloader


def bad_paths(clips: Path, kinds: list[str]) -> dict[int, str]:
    return {
        i: str(clips.parent / f"clip_{i:04d}.mp4")
        for i, k in enumerate(kinds)
        if k in ("corrupt", "too_short")
    }


def test_corrupt_and_short_clips_are_skipped_logged_and_the_run_continues(clips: Path, kinds_of, caplog):
    expected = bad_paths(clips, kinds_of(clips))
    ds = VideoTextDataset(clips, num_frames=17, height=16, width=16, max_bad_fraction=0.3)
    loader = build_dataloader(ds, global_batch_size=2, dp_rank=0, dp_size=1, seed=0)
    with caplog.at_level(logging.WARNING, logger="mm_data"):
        seen = [i for batch in loader for i in batch["index"].tolist()]
    assert len(seen) == len(ds) and not set(seen) & set(expected)
    assert {b.index: b.path for b in ds.bad_samples} == expected
    reasons = {b.index: b.reason for b in ds.bad_samples}
    assert any("too short" in r for r in reasons.values())
    assert all(path in caplog.text for path in expected.values())


def test_a_bad_sample_is_replaced_by_the_next_index(clips: Path, kinds_of):
    ds = VideoTextDataset(clips, num_frames=17, height=16, width=16, max_bad_fraction=0.3)
    corrupt = kinds_of(clips).index("corrupt")
    assert ds[corrupt]["index"] == (corrupt + 2) % len(ds)  # the short clip after it is bad too


def test_exceeding_max_bad_fraction_stops_with_a_report_from_a_worker(clips: Path, kinds_of):
    expected = bad_paths(clips, kinds_of(clips))
    ds = VideoTextDataset(clips, num_frames=17, height=16, width=16, max_bad_fraction=0.05)
    loader = build_dataloader(
        ds, global_batch_size=2, dp_rank=0, dp_size=1, seed=0, num_workers=1, shuffle=False
    )
    with pytest.raises(BadSampleError, match="max_bad_fraction=0.05") as info:
        list(loader)
    assert any(path in str(info.value) for path in expected.values())


def test_check_lists_every_bad_sample(clips: Path, kinds_of):
    ds = VideoTextDataset(clips, num_frames=17, height=16, width=16)
    assert {b.index: b.path for b in ds.check()} == bad_paths(clips, kinds_of(clips))
