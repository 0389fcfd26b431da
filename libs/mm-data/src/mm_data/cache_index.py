"""The sharded latent cache on disk: ``index.json`` and the shard layout.

A cache folder holds ``index.json`` and ``shard-<id>.safetensors`` files (:mod:`mm_data.shards`).
The index, written last and atomically, is what a reader trusts:

- ``num_samples`` and ``bucket_ids``: the source dataset's length and bucket per row (the sample order
  of a run over the cache is the order over the clips, so the sampler works unchanged);
- ``keys``: each row's content key (:mod:`mm_data.cache_keys`), or None for a row the source could not
  read, whose path and reason are in ``bad``;
- ``shards``: each shard's file name, size in bytes and the keys it holds, in order;
- ``made_with`` (version 2): how the cache was made (:mod:`mm_data.cache_made_with`: the maker's recipe,
  the encoders' identity, the reading parameters, the source metadata's identity); an index of version 1
  has none and is still read (a preprocess run reuses its shards and rewrites it as version 2).

**Layout.** The distinct keys, in row order, are cut into shards by their content: a shard ends after a
key whose hash hits a target (expected length ``shard_size``, at least half and at most four times it).
A shard's name is the hash of its keys. So the layout is a function of the samples alone (not of the
ranks, the order work finished, or an interrupted run), and a change is local: a changed clip rewrites
its own shard (the other samples copied, not recomputed), a removed row its shard and at most the next.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

__all__ = ["INDEX_NAME", "CacheIndex", "ShardEntry", "shard_layout", "shard_name"]

INDEX_NAME = "index.json"
"""Name of the index file of a sharded cache folder."""
_FORMAT = "mm-data latent cache"
_VERSION = 2
_READS = (1, 2)
"""Index versions this mm-data reads (1: before ``made_with``)."""


def shard_name(keys: Sequence[str]) -> str:
    """File name of the shard holding ``keys`` (in this order)."""
    return f"shard-{hashlib.sha256(chr(10).join(keys).encode()).hexdigest()[:24]}.safetensors"


def shard_layout(keys: Sequence[str], shard_size: int) -> list[list[str]]:
    """Cut ``keys`` (distinct, in row order) into shards of about ``shard_size`` at content-defined points.

    A shard ends after key ``k`` once it holds at least ``ceil(shard_size / 2)`` keys and
    ``int(k[:15], 16) % step == 0`` (``step = shard_size - ceil(shard_size / 2) + 1``: the expected
    length is then ``shard_size``), or when it holds ``4 * shard_size`` (rare: the cap is where a
    change can shift the cuts after it, until the next content-defined cut).
    """
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    least = -(-shard_size // 2)
    step = shard_size - least + 1
    shards: list[list[str]] = []
    current: list[str] = []
    for key in keys:
        current.append(key)
        if len(current) >= 4 * shard_size or (len(current) >= least and int(key[:15], 16) % step == 0):
            shards.append(current)
            current = []
    if current:
        shards.append(current)
    return shards


@dataclass(frozen=True)
class ShardEntry:
    """One shard of the index: file name, size in bytes, keys held (in order)."""

    name: str
    bytes: int
    keys: list[str]


@dataclass
class CacheIndex:
    """The content of ``index.json`` (see the module docstring)."""

    num_samples: int
    bucket_ids: list[int]
    keys: list[str | None]
    shards: list[ShardEntry]
    bad: dict[int, tuple[str, str]] = field(default_factory=dict)
    shard_size: int = 64
    made_with: dict[str, Any] | None = None
    """How the cache was made (:func:`mm_data.cache_made_with.made_with`); None in a version-1 index."""

    def __post_init__(self) -> None:
        if not len(self.bucket_ids) == len(self.keys) == self.num_samples:
            raise ValueError(
                f"cache index: {len(self.bucket_ids)} bucket ids and {len(self.keys)} keys for "
                f"{self.num_samples} samples"
            )
        missing = [i for i, k in enumerate(self.keys) if k is None and i not in self.bad]
        if missing:
            raise ValueError(f"cache index: rows {missing[:5]} have neither a key nor a bad-sample entry")

    @cached_property
    def shard_of(self) -> dict[str, ShardEntry]:
        """Key -> the shard holding it."""
        return {key: shard for shard in self.shards for key in shard.keys}

    @cached_property
    def rows_of(self) -> dict[str, list[int]]:
        """Key -> the rows that are this sample (several when rows repeat a clip and caption)."""
        rows: dict[str, list[int]] = {}
        for row, key in enumerate(self.keys):
            if key is not None:
                rows.setdefault(key, []).append(row)
        return rows

    def shard_rows(self, name: str) -> list[int]:
        """The rows whose samples the shard ``name`` holds (for error messages)."""
        entry = next((s for s in self.shards if s.name == name), None)
        return sorted(r for key in (entry.keys if entry else []) for r in self.rows_of.get(key, []))

    def to_json(self) -> str:
        data = {
            "format": _FORMAT,
            "version": _VERSION,
            "num_samples": self.num_samples,
            "shard_size": self.shard_size,
            "bucket_ids": self.bucket_ids,
            "keys": self.keys,
            "bad": {str(row): list(self.bad[row]) for row in sorted(self.bad)},
            "shards": [{"name": s.name, "bytes": s.bytes, "keys": s.keys} for s in self.shards],
            "made_with": self.made_with,
        }
        return json.dumps(data, separators=(",", ":"))

    def save(self, root: str | Path) -> Path:
        """Write ``root/index.json`` atomically (temporary file + rename)."""
        path = Path(root) / INDEX_NAME
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        tmp.write_text(self.to_json())
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, root: str | Path) -> CacheIndex:
        """Read ``root/index.json``.

        Raises:
            FileNotFoundError: there is none. ValueError: it is not a cache index this version reads.
        """
        path = Path(root) / INDEX_NAME
        try:
            data: dict[str, Any] = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{path}: no cache index; write the cache with mm_data.cache_dataset"
            ) from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON ({e}); run the preprocess again to rewrite it") from e
        if data.get("format") != _FORMAT or data.get("version") not in _READS:
            raise ValueError(
                f"{path}: format {data.get('format')!r} version {data.get('version')!r}; this mm-data reads "
                f"{_FORMAT!r} versions {', '.join(map(str, _READS))}"
            )
        try:
            return cls(
                num_samples=int(data["num_samples"]),
                bucket_ids=[int(b) for b in data["bucket_ids"]],
                keys=list(data["keys"]),
                shards=[ShardEntry(s["name"], int(s["bytes"]), list(s["keys"])) for s in data["shards"]],
                bad={int(row): (str(p), str(r)) for row, (p, r) in data.get("bad", {}).items()},
                shard_size=int(data.get("shard_size", 64)),
                made_with=data.get("made_with") if data["version"] >= 2 else None,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: malformed cache index ({e!r}); run the preprocess again") from e
