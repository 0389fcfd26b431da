"""`MultimodalCollator`: conversation items -> one padded (or packed) batch of model inputs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .chat_template import IGNORE_INDEX

__all__ = ["MultimodalCollator"]

#: per-token keys of an item and the value that pads them
TOKEN_KEYS = {"input_ids": None, "labels": IGNORE_INDEX, "mm_token_type_ids": 0}


class MultimodalCollator:
    """Pads token sequences to the longest item (right side) with an ``attention_mask``, or packs all
    items of the micro-batch into one row with ``position_ids`` restarting at 0 for each item, so that a
    model that builds its mask from position ids (transformers' packed-sequence masks, varlen
    attention) keeps samples apart. Media tensors (``item["media"]``) are concatenated over items in
    order (e.g. ``pixel_values``, ``image_grid_thw``). The batch also holds ``num_samples`` (items, for
    the metrics) and ``skipped`` (bad samples passed over, for ``mm_trainer.BatchStream``).
    """

    def __init__(self, pad_token_id: int, *, packing: bool = False) -> None:
        self.pad_token_id, self.packing = int(pad_token_id), packing

    def __call__(self, items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if not items:
            raise ValueError("cannot collate an empty batch")
        batch = self._pack(items) if self.packing else self._pad(items)
        batch.update(_concat_media(items))
        batch["num_samples"] = torch.tensor(len(items))
        batch["skipped"] = [list(item.get("skipped", [])) for item in items]
        return batch

    def _pad(self, items: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        longest = max(len(item["input_ids"]) for item in items)
        out: dict[str, torch.Tensor] = {}
        for key, pad in TOKEN_KEYS.items():
            if key in items[0]:
                fill = self.pad_token_id if pad is None else pad
                out[key] = torch.tensor([list(i[key]) + [fill] * (longest - len(i[key])) for i in items])
        out["attention_mask"] = torch.tensor(
            [[1] * len(i["input_ids"]) + [0] * (longest - len(i["input_ids"])) for i in items]
        )
        return out

    def _pack(self, items: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        out = {
            key: torch.tensor([sum((list(i[key]) for i in items), [])])
            for key in TOKEN_KEYS
            if key in items[0]
        }
        out["position_ids"] = torch.cat([torch.arange(len(i["input_ids"])) for i in items])[None]
        return out


def _concat_media(items: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
    keys: list[str] = []
    for item in items:
        keys += [k for k in item.get("media", {}) if k not in keys]
    return {k: torch.cat([item["media"][k] for item in items if k in item.get("media", {})]) for k in keys}
