"""`PrecomputedLatentDataset`: the samples of a latent cache folder, each as it was stored.

The folder is a sharded cache (``index.json``: :func:`mm_data.cache_dataset`), or a folder of per-sample
``.safetensors`` / ``.pt`` files (:func:`mm_data.save_precomputed`, earlier mm-data versions, or any tool
writing that layout).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch.utils.data import Dataset

from .cache_index import INDEX_NAME
from .cache_store import ShardedStore
from .precomputed import PRECOMPUTED_EXTENSIONS, REQUIRED_KEYS, load_precomputed

__all__ = ["PrecomputedLatentDataset"]


def _latents_shape(path: Path) -> tuple[int, ...] | None:
    if path.suffix != ".safetensors":
        return None
    with safe_open(str(path), framework="pt") as f:
        return tuple(f.get_slice("latents").get_shape()) if "latents" in f.keys() else None


class PrecomputedLatentDataset(Dataset):
    """Samples cached by :func:`mm_data.cache_dataset` (or any tool writing per-sample files).

    Items: every stored tensor, ``metadata`` (dict), ``prompt`` (from metadata, ``""`` if absent),
    ``index`` and ``bucket`` (samples whose ``latents`` have the same shape share a bucket, so the
    :class:`GlobalOrderSampler` never mixes shapes in a batch). Samples the source could not read are
    not in it (a sharded cache lists them as bad; a per-file folder has no file for them).
    """

    def __init__(self, root: str | Path, *, required: Sequence[str] = REQUIRED_KEYS) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"precomputed dataset folder not found: {self.root}")
        self.required = tuple(required)
        self.store: ShardedStore | None = None
        if (self.root / INDEX_NAME).is_file():
            self.store = ShardedStore(self.root)
            self.rows = self.store.good_rows()
            shapes = [self.store.shape_of(row, "latents") for row in self.rows]
            self.files: list[Path] = []
        else:
            self.files = sorted(
                p
                for p in self.root.iterdir()
                if p.suffix in PRECOMPUTED_EXTENSIONS and not p.name.startswith(".")
            )
            self.rows = list(range(len(self.files)))
            shapes = [_latents_shape(p) for p in self.files]
        if not self.rows:
            raise ValueError(
                f"{self.root}: no cached samples ({INDEX_NAME} or {'/'.join(PRECOMPUTED_EXTENSIONS)} files)"
            )
        #: Each sample's ``latents`` shape (from the file headers; None where it has none).
        self.latent_shapes: list[tuple[int, ...] | None] = shapes
        ids: dict[Any, int] = {}
        self.bucket_ids = [ids.setdefault(s, len(ids)) for s in shapes]

    def __len__(self) -> int:
        return len(self.rows)

    def _load(self, index: int) -> tuple[dict[str, torch.Tensor], dict[str, Any], str]:
        if self.store is not None:
            row = self.rows[index]
            return (*self.store.read(row), f"{self.root} sample {row}")
        path = self.files[index]
        return (*load_precomputed(path), str(path))

    def __getitem__(self, index: int) -> dict[str, Any]:
        tensors, metadata, where = self._load(int(index))
        missing = [k for k in self.required if k not in tensors]
        if missing:
            raise KeyError(f"{where}: missing tensors {missing}; has {sorted(tensors)}")
        return {
            **tensors,
            "prompt": metadata.get("prompt", ""),
            "metadata": metadata,
            "index": int(index),
            "bucket": self.bucket_ids[int(index)],
        }
