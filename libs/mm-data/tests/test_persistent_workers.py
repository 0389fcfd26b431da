"""``persistent_workers``: the same worker processes serve every epoch and still see each epoch."""

from __future__ import annotations

import os

import pytest
from mm_data import build_dataloader
from torch.utils.data import Dataset


class WhoReads(Dataset):
    """Items say which process read them and at which epoch the dataset was."""

    def __init__(self) -> None:
        self.epoch = 0

    def __len__(self) -> int:
        return 4

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __getitem__(self, index: int) -> tuple[int, int]:
        return os.getpid(), self.epoch


def two_epochs(**kwargs) -> list[list[tuple[int, int]]]:
    loader = build_dataloader(
        WhoReads(), global_batch_size=2, dp_rank=0, dp_size=1, shuffle=False, collate_fn=list, **kwargs
    )
    return [[item for batch in loader for item in batch] for _ in range(2)]


def test_persistent_workers_serve_every_epoch_and_see_its_number():
    first, second = two_epochs(num_workers=1, persistent_workers=True)
    assert {pid for pid, _ in first} == {pid for pid, _ in second} != {os.getpid()}
    assert [epoch for _, epoch in first] == [0] * 4 and [epoch for _, epoch in second] == [1] * 4


def test_without_persistent_workers_each_epoch_starts_new_workers():
    first, second = two_epochs(num_workers=1)
    assert {pid for pid, _ in first}.isdisjoint({pid for pid, _ in second})
    assert [epoch for _, epoch in second] == [1] * 4


def test_persistent_workers_without_workers_are_refused():
    with pytest.raises(ValueError, match="persistent_workers needs num_workers > 0"):
        two_epochs(persistent_workers=True)
