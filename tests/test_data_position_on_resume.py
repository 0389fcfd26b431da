"""A checkpoint's data position on resume: missing is an error naming what is missing, unless the
config resets it on purpose (training.reset_data_position)."""

from __future__ import annotations

import shutil

import pytest

SECTIONS = {"training": {"train_iters": 3, "save_interval": 2, "log_sample_ids": True}}


@pytest.mark.slow
def test_a_missing_data_state_is_an_error_naming_the_file_unless_reset_on_purpose(toy_yaml, mm_train_forked):
    first, second = toy_yaml("first", **SECTIONS), toy_yaml("second", **SECTIONS)
    ckpt = first.parent / "ckpt"
    mm_train_forked(first, "training.train_iters=2")
    shutil.rmtree(ckpt / "iter_0000002" / "rank_state")

    missing = (
        r"CheckpointLoadError: .* lacks per-rank state \[.*rank_state/dp_rank_00000.pt'\]: \['dataloader'\]"
    )
    with pytest.raises(AssertionError, match=missing):
        mm_train_forked(second, f"training.load={ckpt}")

    records = mm_train_forked(second, f"training.load={ckpt}", "training.reset_data_position=true")
    assert [r["step"] for r in records] == [3]
    assert records[0]["sample_ids"] == [0, 1, 2, 3]  # the data started over, on purpose
