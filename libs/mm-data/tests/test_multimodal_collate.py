"""MultimodalCollator: padding with a mask, or packing into one row with restarting positions."""

from __future__ import annotations

import torch
from mm_data import IGNORE_INDEX, MultimodalCollator

ITEMS = [
    {"input_ids": [5, 6, 7], "labels": [IGNORE_INDEX, 6, 7], "media": {"pixel_values": torch.ones(2, 3)},
     "skipped": [4]},
    {"input_ids": [8, 9], "labels": [IGNORE_INDEX, 9], "media": {}, "skipped": []},
    {"input_ids": [1, 2, 3, 4], "labels": [IGNORE_INDEX, 2, 3, 4], "media": {"pixel_values": torch.zeros(1, 3)},
     "skipped": []},
]  # fmt: skip


def test_padding_right_with_mask_and_ignored_labels():
    batch = MultimodalCollator(0)(ITEMS)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 0], [8, 9, 0, 0], [1, 2, 3, 4]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    assert batch["labels"][1].tolist() == [IGNORE_INDEX, 9, IGNORE_INDEX, IGNORE_INDEX]
    assert torch.equal(batch["pixel_values"], torch.cat([torch.ones(2, 3), torch.zeros(1, 3)]))
    assert batch["skipped"] == [[4], [], []] and int(batch["num_samples"]) == 3


def test_packing_puts_the_items_in_one_row_with_positions_restarting():
    batch = MultimodalCollator(0, packing=True)(ITEMS)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9, 1, 2, 3, 4]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3]]
    assert "attention_mask" not in batch
    assert batch["labels"].tolist() == [[IGNORE_INDEX, 6, 7, IGNORE_INDEX, 9, IGNORE_INDEX, 2, 3, 4]]
    assert int(batch["num_samples"]) == 3
