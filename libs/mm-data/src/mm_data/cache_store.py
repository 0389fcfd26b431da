"""Random access to a latent cache folder by sample id (its row in the source metadata), whatever its layout.

- **Sharded** (``index.json``, written by :func:`mm_data.cache_dataset`): samples live in shards
  (:mod:`mm_data.cache_index`, :mod:`mm_data.shards`); a reader keeps a few shards open per process.
- **Per-file** (``cache.json``, written by mm-data before the sharded format): one
  ``NNNNNNNN.safetensors`` per row and ``NNNNNNNN.bad.json`` per row the source could not read. Still
  read; written only as a copy of a sharded cache (:func:`write_per_file_copy`, whose manifest carries
  the sharded cache's ``made_with``: :mod:`mm_data.cache_made_with`).

:func:`open_cache` returns either as a :class:`SampleStore`; the datasets over a cache
(:class:`~mm_data.CachedVideoTextDataset`, :class:`~mm_data.PrecomputedLatentDataset`) read through it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors import safe_open

from .cache_index import INDEX_NAME, CacheIndex
from .precomputed import load_precomputed, save_precomputed
from .shards import ShardReader

__all__ = [
    "CACHE_MANIFEST",
    "FileStore",
    "SampleStore",
    "ShardedStore",
    "bad_marker_name",
    "cache_file_name",
    "open_cache",
    "read_cache_manifest",
    "write_per_file_copy",
]

CACHE_MANIFEST = "cache.json"
"""Name of the manifest file of a per-file cache folder."""


def cache_file_name(index: int) -> str:
    """File name of sample ``index`` in a per-file cache folder."""
    return f"{index:08d}.safetensors"


def bad_marker_name(index: int) -> str:
    """File name of the marker of sample ``index`` that the source could not read (per-file cache)."""
    return f"{index:08d}.bad.json"


def read_cache_manifest(root: str | Path) -> dict[str, Any]:
    """``cache.json`` of a per-file cache folder: ``num_samples`` and ``bucket_ids`` of the source dataset."""
    path = Path(root) / CACHE_MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no cache manifest; write the cache with mm_data.cache_dataset")
    manifest = json.loads(path.read_text())
    if len(manifest.get("bucket_ids", [])) != manifest.get("num_samples"):
        raise ValueError(f"{path}: bucket_ids must list one bucket per sample (num_samples)")
    return manifest


class SampleStore(Protocol):
    """What the cache datasets need from a cache folder."""

    root: Path
    bucket_ids: list[int]

    def bad(self, row: int) -> tuple[str, str] | None:
        """``(path, reason)`` of a row the source could not read, else None."""

    def read(self, row: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """``(tensors, metadata)`` of a cached row."""

    def incomplete(self) -> list[int]:
        """Rows neither cached nor marked bad (an unfinished preprocess)."""

    def shape_of(self, row: int, tensor: str) -> tuple[int, ...] | None:
        """Shape of one tensor of a cached row, from the file header (no tensor data read); None if absent."""


class ShardedStore:
    """A sharded cache folder (``index.json``).

    Args:
        root: The cache folder.
        max_open: Shards each process keeps open.
    """

    def __init__(self, root: str | Path, *, max_open: int = 4096) -> None:
        self.root = Path(root)
        self.index = CacheIndex.load(self.root)
        self.bucket_ids = self.index.bucket_ids
        sizes = {self.root / s.name: s.bytes for s in self.index.shards}
        self.reader = ShardReader(
            max_open, describe=lambda p: self.index.shard_rows(p.name), expected_bytes=sizes.get
        )

    @property
    def made_with(self) -> dict[str, Any] | None:
        """How the cache was made (:mod:`mm_data.cache_made_with`); None in an index of version 1."""
        return self.index.made_with

    def bad(self, row: int) -> tuple[str, str] | None:
        return self.index.bad.get(row)

    def read(self, row: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        key = self.index.keys[row]
        if key is None:
            raise KeyError(f"{self.root}: row {row} is a bad sample ({self.index.bad[row]})")
        return self.reader.read(self.root / self.index.shard_of[key].name, key)

    def incomplete(self) -> list[int]:
        return []  # the index is written only once every row is cached or marked bad

    def good_rows(self) -> list[int]:
        """Rows that hold a sample."""
        return [row for row, key in enumerate(self.index.keys) if key is not None]

    def shape_of(self, row: int, tensor: str) -> tuple[int, ...] | None:
        """Shape of one tensor of a row, from its shard's header (no tensor data read)."""
        key = self.index.keys[row]
        assert key is not None
        handle = self.reader._shard(self.root / self.index.shard_of[key].name).handle
        name = f"{key}/{tensor}"
        return tuple(handle.get_slice(name).get_shape()) if name in handle.keys() else None


class FileStore:
    """A per-file cache folder (``cache.json`` + one file per row)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.manifest = read_cache_manifest(self.root)
        self.bucket_ids = [int(b) for b in self.manifest["bucket_ids"]]

    @property
    def made_with(self) -> dict[str, Any] | None:
        """How the cache was made: a copy's (:func:`write_per_file_copy`); None in one of earlier versions."""
        return self.manifest.get("made_with")

    def bad(self, row: int) -> tuple[str, str] | None:
        if (self.root / cache_file_name(row)).is_file():
            return None
        marker = self.root / bad_marker_name(row)
        if not marker.is_file():
            return None
        data = json.loads(marker.read_text())
        return str(data.get("path", "?")), str(data.get("reason", "unreadable"))

    def read(self, row: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return load_precomputed(self.root / cache_file_name(row))

    def shape_of(self, row: int, tensor: str) -> tuple[int, ...] | None:
        with safe_open(str(self.root / cache_file_name(row)), framework="pt") as f:
            return tuple(f.get_slice(tensor).get_shape()) if tensor in f.keys() else None

    def incomplete(self) -> list[int]:
        names = {p.name for p in self.root.iterdir()}
        return [
            i for i in range(len(self.bucket_ids))
            if cache_file_name(i) not in names and bad_marker_name(i) not in names
        ]  # fmt: skip


def write_per_file_copy(root: str | Path, out: str | Path) -> Path:
    """Copy the cache ``root`` into ``out`` in the per-file layout of earlier mm-data versions (for tools that
    read that layout, and to compare the two layouts); returns ``out``."""
    store, out = open_cache(root), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for row in range(len(store.bucket_ids)):
        bad = store.bad(row)
        if bad is not None:
            (out / bad_marker_name(row)).write_text(json.dumps({"path": bad[0], "reason": bad[1]}))
        else:
            save_precomputed(out / cache_file_name(row), *store.read(row))
    manifest: dict[str, Any] = {"num_samples": len(store.bucket_ids), "bucket_ids": list(store.bucket_ids)}
    if store.made_with is not None:
        manifest["made_with"] = store.made_with
    (out / CACHE_MANIFEST).write_text(json.dumps(manifest))
    return out


def open_cache(root: str | Path, *, max_open: int = 4096) -> ShardedStore | FileStore:
    """The cache folder ``root``: sharded when it has ``index.json``, else per-file (``cache.json``).

    Raises:
        FileNotFoundError: neither file is there (the message says how to write a cache).
    """
    root = Path(root)
    if (root / INDEX_NAME).is_file():
        return ShardedStore(root, max_open=max_open)
    if (root / CACHE_MANIFEST).is_file():
        return FileStore(root)
    staged = (root / "staging").is_dir()
    hint = " (a preprocess started here and did not finish: run it again, it continues)" if staged else ""
    raise FileNotFoundError(
        f"{root}: no cache index ({INDEX_NAME}) nor per-file manifest ({CACHE_MANIFEST}){hint}; write the "
        "cache with the app's preprocess command or mm_data.cache_dataset"
    )
