"""What a preprocess run has to do: every row's content key, what the cache folder already holds, and
which rows each rank encodes (docs/DESIGN.md "Latent cache").

Every rank builds the plan from the same inputs (the metadata, the clips' digests and the verdicts on
the folder's files, both computed once and shared by the ranks), so the work is split by sample, never
by arrival: rank ``r`` of ``W`` encodes the rows ``i`` with ``i % W == r`` whose key is cached nowhere
yet. A key is *available* when it is in a shard of the current index, in a complete shard file an
interrupted run left, or in a sample file an interrupted run staged (``staging/<key>.safetensors``),
and that file passed :func:`~mm_data.shards.verify_shard` this run (its size, header and every tensor's
CRC-32); a damaged file's samples are encoded again and the file is rewritten. A row whose source could
not be read in an interrupted run (``staging/<key>.bad.json``) is not retried within the same resumed
run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cache_index import INDEX_NAME, CacheIndex
from .cache_keys import content_key
from .file_records import default_workers
from .shards import CorruptShardError, read_shard_header, verify_shard

__all__ = [
    "STAGING",
    "CachePlan",
    "Location",
    "cache_files",
    "plan_cache",
    "staged_bad",
    "staged_file",
    "verify_files",
]

STAGING = "staging"
"""Folder (inside the cache folder) of the sample files encoded before they are packed into shards."""


def staged_file(root: Path, key: str) -> Path:
    """A sample encoded in this run, waiting to be packed into its shard."""
    return root / STAGING / f"{key}.safetensors"


def staged_bad(root: Path, key: str) -> Path:
    """The marker of a sample whose source could not be read in this run: ``{"path", "reason"}``."""
    return root / STAGING / f"{key}.bad.json"


@dataclass(frozen=True)
class Location:
    """Where an available sample is: a shard (``staged`` False) or a staged sample file."""

    path: Path
    staged: bool = False


@dataclass
class CachePlan:
    """The plan of one run (identical on every rank that built it from the same folder state)."""

    root: Path
    keys: list[str | None]
    """Per row: its content key, or None when its clip cannot be read at all (see ``unreadable``)."""
    digests: list[str | None]
    """Per row: the SHA-256 of its clip (None: see ``unreadable``)."""
    bucket_ids: list[int]
    unreadable: dict[int, tuple[str, str]]
    """Rows whose clip could not be hashed: ``(path, reason)``."""
    available: dict[str, Location]
    staged_bad: dict[str, tuple[str, str]]
    """Keys an interrupted run could not read: ``(path, reason)``."""
    previous: CacheIndex | None
    corrupt: list[CorruptShardError] = field(default_factory=list)
    """Shards of the previous index found damaged (their samples are encoded again)."""
    damaged: dict[str, str] = field(default_factory=dict)
    """Every file of the folder that failed :func:`verify_shard` (path -> why): never kept nor read."""

    @property
    def todo(self) -> list[int]:
        """Rows to encode, all ranks: the first row of each key that is neither available nor known bad."""
        seen: set[str] = set()
        rows = []
        for row, key in enumerate(self.keys):
            if key is None or key in seen:
                continue
            seen.add(key)
            if key not in self.available and key not in self.staged_bad:
                rows.append(row)
        return rows

    def rank_todo(self, rank: int, world_size: int) -> list[int]:
        """This rank's rows: ``todo`` rows ``i`` with ``i % world_size == rank``."""
        return [row for row in self.todo if row % world_size == rank]

    @property
    def resumed(self) -> set[str]:
        """Available keys an interrupted run left (staged, or in a shard no index lists)."""
        listed = set(self.previous.shard_of) if self.previous else set()
        return {key for key, where in self.available.items() if where.staged or key not in listed}


def _draws_prompt(row: Mapping[str, Any], caption_dropout: float) -> bool:
    caption = row.get("caption", "")
    return caption_dropout > 0 or (not isinstance(caption, str) and len(set(caption)) > 1)


def sample_keys(
    dataset: Any,
    identity: Mapping[str, Any],
    records: Mapping[str, Mapping[str, Any] | None],
    *,
    uses_prompt: bool,
) -> tuple[list[str | None], list[str | None], dict[int, tuple[str, str]]]:
    """Each row's content key (``mm_data.cache_keys``) and clip digest, and the rows whose clip cannot be
    read.

    Args:
        dataset: A :class:`~mm_data.VideoTextDataset` (rows, buckets, reading parameters).
        identity: The encoders' identity (weights digests, dtypes, options).
        records: Each clip path's record with its ``sha256`` (:func:`mm_data.clip_digests`).
        uses_prompt: The encoder reads the item's drawn ``prompt``: rows whose draw varies (a caption
            list, caption dropout) are keyed by their index too.
    """
    rows = dataset.rows
    reading = dataset.reading_params()
    keys: list[str | None] = []
    unreadable: dict[int, tuple[str, str]] = {}
    digests = [(records[row["path"]] or {}).get("sha256") for row in rows]
    for i, (row, digest) in enumerate(zip(rows, digests)):
        record = records[row["path"]]
        if digest is None:
            reason = (record or {}).get("sha256_error") or "cannot read the file (missing or not permitted)"
            unreadable[i] = (row["path"], reason.removeprefix(f"{row['path']}: "))
            keys.append(None)
            continue
        parts = {
            "clip": digest,
            "row": {k: v for k, v in row.items() if k != "path"},
            "bucket": list(dataset.buckets[dataset.bucket_ids[i]]),
            "reading": reading,
            "encoders": dict(identity),
        }
        if uses_prompt and _draws_prompt(row, float(reading.get("caption_dropout", 0.0))):
            parts["index"] = i
        keys.append(content_key(parts))
    return keys, digests, unreadable


def cache_files(root: Path, previous: CacheIndex | None) -> list[tuple[Path, int | None]]:
    """Every file a run might keep or read samples from, with the size the index recorded (None: not
    listed): the index's shards, unlisted shard files an interrupted run left, staged sample files."""
    listed = {shard.name: shard.bytes for shard in previous.shards} if previous else {}
    files: list[tuple[Path, int | None]] = [(root / name, size) for name, size in listed.items()]
    files += [(p, None) for p in sorted(root.glob("shard-*.safetensors")) if p.name not in listed]
    folder = root / STAGING
    files += [(p, None) for p in sorted(folder.glob("*.safetensors"))] if folder.is_dir() else []
    return files


def verify_files(files: list[tuple[Path, int | None]], workers: int | None = None) -> dict[str, str]:
    """:func:`verify_shard` of each ``(path, expected size)`` in ``workers`` threads (default: the CPUs, at
    most 8); the damaged ones: path -> why."""
    with ThreadPoolExecutor(max_workers=workers or default_workers()) as pool:
        verdicts = list(pool.map(lambda file: verify_shard(*file), files))
    return {str(path): why for (path, _), why in zip(files, verdicts) if why is not None}


def _scan(
    root: Path, previous: CacheIndex | None, damaged: Mapping[str, str]
) -> tuple[dict[str, Location], list[CorruptShardError]]:
    """Keys available in the folder's shards that passed verification: the index's and unlisted ones."""
    available: dict[str, Location] = {}
    corrupt: list[CorruptShardError] = []
    listed = set()
    for shard in previous.shards if previous else []:
        listed.add(shard.name)
        path = root / shard.name
        if str(path) in damaged:
            corrupt.append(CorruptShardError(path, damaged[str(path)], previous.shard_rows(shard.name)))  # type: ignore[union-attr]
            continue
        available.update({key: Location(path) for key in shard.keys})
    for path in sorted(root.glob("shard-*.safetensors")):
        if path.name in listed or str(path) in damaged:
            continue  # a damaged unlisted shard: removed when the run commits
        try:
            keys = read_shard_header(path)
        except CorruptShardError:
            continue  # not a complete shard: removed when the run commits
        available.update({key: Location(path) for key in keys if key not in available})
    return available, corrupt


def _staged(root: Path, damaged: Mapping[str, str]) -> tuple[dict[str, Location], dict[str, tuple[str, str]]]:
    staged: dict[str, Location] = {}
    bad: dict[str, tuple[str, str]] = {}
    folder = root / STAGING
    for path in sorted(folder.glob("*.safetensors")) if folder.is_dir() else []:
        if str(path) not in damaged:  # a damaged one is encoded again (and replaced)
            staged[path.name.removesuffix(".safetensors")] = Location(path, staged=True)
    for path in sorted(folder.glob("*.bad.json")) if folder.is_dir() else []:
        data = json.loads(path.read_text())
        bad[path.name.removesuffix(".bad.json")] = (str(data["path"]), str(data["reason"]))
    return staged, bad


def previous_index(root: Path) -> CacheIndex | None:
    """The folder's current index, None when it has none (or one this version cannot read: rewritten)."""
    if not (root / INDEX_NAME).is_file():
        return None
    try:
        return CacheIndex.load(root)
    except ValueError:
        return None


def plan_cache(
    dataset: Any,
    root: str | Path,
    identity: Mapping[str, Any],
    records: Mapping[str, Mapping[str, Any] | None],
    damaged: Mapping[str, str],
    *,
    uses_prompt: bool = True,
) -> CachePlan:
    """The plan of a run writing ``dataset``'s cache into ``root`` (see the module docstring).

    Args:
        records: The clips' digests (:func:`mm_data.clip_digests`).
        damaged: The folder's files that failed verification (:func:`verify_files` of :func:`cache_files`).
    """
    root = Path(root)
    keys, digests, unreadable = sample_keys(dataset, identity, records, uses_prompt=uses_prompt)
    previous = previous_index(root)
    available, corrupt = _scan(root, previous, damaged)
    staged, bad = _staged(root, damaged)
    available.update({k: v for k, v in staged.items() if k not in available})
    bucket_ids = [int(b) for b in dataset.bucket_ids]
    return CachePlan(
        root, keys, digests, bucket_ids, unreadable, available, bad, previous, corrupt, dict(damaged)
    )
