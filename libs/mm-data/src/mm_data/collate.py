"""`collate_video_text` / `collate_packed`: a list of dataset items -> one batch dict."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import default_collate

__all__ = ["collate_packed", "collate_video_text"]


def collate_video_text(batch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Stack tensors, turn numbers into tensors and strings (prompts) into lists.

    Raises:
        ValueError: an empty batch, items with different keys, a batch mixing buckets, or
            tensors of one key with different shapes (the message names the key and shapes).
    """
    if not batch:
        raise ValueError("cannot collate an empty batch")
    keys = list(batch[0])
    for item in batch[1:]:
        if list(item) != keys:
            raise ValueError(f"batch items have different keys: {keys} vs {list(item)}")
    buckets = {item["bucket"] for item in batch if "bucket" in item}
    if len(buckets) > 1:
        raise ValueError(
            f"batch mixes buckets {sorted(buckets)}; use GlobalOrderSampler with the dataset's buckets"
        )
    return {key: _collate_values(key, [item[key] for item in batch]) for key in keys}


def _collate_values(key: str, values: list[Any]) -> Any:
    if all(isinstance(v, torch.Tensor) for v in values):
        shapes = {tuple(v.shape) for v in values}
        if len(shapes) > 1:
            raise ValueError(f"cannot stack {key!r}: shapes differ {sorted(shapes)}")
        return default_collate(values)  # in a worker it stacks straight into shared memory
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return torch.tensor(values)
    return list(values)


def collate_packed(batch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A packed micro-batch (:class:`mm_data.TokenBalancedSampler`): every tensor kept per sample in a
    list (shapes may differ: a packed forward takes the list), numbers as a tensor, the rest as lists.

    Raises:
        ValueError: an empty batch or items with different keys.
    """
    if not batch:
        raise ValueError("cannot collate an empty batch")
    keys = list(batch[0])
    for item in batch[1:]:
        if list(item) != keys:
            raise ValueError(f"batch items have different keys: {keys} vs {list(item)}")
    out: dict[str, Any] = {}
    for key in keys:
        values = [item[key] for item in batch]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[key] = torch.tensor(values)
        else:
            out[key] = list(values)
    return out
