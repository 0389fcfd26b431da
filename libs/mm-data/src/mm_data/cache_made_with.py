"""How a latent cache was made, recorded in it, and the check of a training run against it
(docs/DESIGN.md "Latent cache").

A preprocess run records in the cache (``index.json``'s ``made_with``; a per-file copy's ``cache.json``):

- ``recipe``: what the maker says the cache is made from, in its own terms: the apps' ``preprocess``
  record their config section's keys that decide the cached tensors (``data.dataset.preprocess.clips.
  height: 32``, ...), flattened to ``{dotted key: value}``; None when the maker gave none;
- ``encoders``: the encoders' identity hashed into every key (weights' digests, dtypes, options);
- ``reading``: the clip reader's parameters and buckets;
- ``source``: the metadata file's path, SHA-256 and row count (a caption folder's SHA-256 is that of its
  rows: every clip's path and caption, see :func:`source_sha256`; the clips' bytes are the clip
  digests' concern).

A training run that names how its cache should have been made (the apps: their config's preprocess
section) calls :func:`check_cache_made_with` before it builds anything: every recipe key whose value
differs is named with both values, and a source metadata file whose bytes changed since the cache was
made is named too; either refuses the run (:class:`CacheMismatchError`). Refusing the changed source,
rather than warning, is deliberate: the cache then holds the samples of a file that is no longer there,
and a re-run of the preprocess makes it current at the cost of what changed. A cache that records no
recipe (an index of version 1, a per-file cache of earlier versions, a folder of per-sample files) is
refused too: nothing says it was made as the run says.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .cache_index import INDEX_NAME
from .cache_keys import canonical_json
from .cache_store import CACHE_MANIFEST, open_cache
from .caption_folder import read_caption_folder
from .file_records import sha256_file
from .precomputed import PRECOMPUTED_EXTENSIONS

__all__ = [
    "CacheMismatchError",
    "cache_made_with",
    "check_cache_made_with",
    "made_with",
    "recipe_differences",
    "source_sha256",
]

logger = logging.getLogger("mm_data")

_UNSET = object()


class CacheMismatchError(ValueError):
    """A cache was not made as the run that reads it says (or does not say how it was made)."""


def _plain(value: Any) -> Any:
    """``value`` as JSON gives it back (sorted keys, lists for tuples): what a recorded value compares to."""
    return json.loads(canonical_json(value))


def source_sha256(path: str | Path) -> str:
    """SHA-256 of a data source: a metadata file's bytes; for a caption folder, that of its rows (each
    clip's path and caption, in the folder's order) as canonical JSON, so a caption edited, a clip added or
    one removed changes it."""
    path = Path(path)
    if path.is_dir():
        return hashlib.sha256(canonical_json(read_caption_folder(path)).encode()).hexdigest()
    return sha256_file(path)


def made_with(dataset: Any, identity: Mapping[str, Any], recipe: Mapping[str, Any] | None) -> dict[str, Any]:
    """The record of a cache of ``dataset`` (a :class:`~mm_data.VideoTextDataset`) encoded by encoders of
    ``identity``, made as ``recipe`` says (see the module docstring)."""
    metadata = Path(dataset.metadata_path).resolve()
    reading = {**dataset.reading_params(), "buckets": [list(b) for b in dataset.buckets]}
    return _plain({
        "recipe": dict(recipe) if recipe is not None else None,
        "encoders": dict(identity),
        "reading": reading,
        "source": {"path": str(metadata), "sha256": source_sha256(metadata), "rows": len(dataset.rows)},
    })  # fmt: skip


def cache_made_with(root: str | Path) -> dict[str, Any] | None:
    """The record of the cache folder ``root``; None where it has none (see the module docstring).

    Raises:
        FileNotFoundError: ``root`` holds no cache at all (the message says how to write one).
    """
    root = Path(root)
    indexed = (root / INDEX_NAME).is_file() or (root / CACHE_MANIFEST).is_file()
    if not indexed and root.is_dir() and any(p.suffix in PRECOMPUTED_EXTENSIONS for p in root.iterdir()):
        return None  # a folder of per-sample files
    return open_cache(root).made_with


def _shown(value: Any) -> str:
    return "(not set)" if value is _UNSET else json.dumps(value)


def recipe_differences(recorded: Mapping[str, Any], expected: Mapping[str, Any]) -> list[str]:
    """One line per key whose value differs between a cache's ``recorded`` recipe and the ``expected`` one:
    the key, the cache's value, the run's value."""
    wanted = _plain(dict(expected))
    lines = []
    for key in sorted(set(recorded) | set(wanted)):
        mine, theirs = recorded.get(key, _UNSET), wanted.get(key, _UNSET)
        if mine != theirs:
            lines.append(f"{key}: the cache was made with {_shown(mine)}, this run says {_shown(theirs)}")
    return lines


def _source_change(source: Mapping[str, Any]) -> str | None:
    """Why the source metadata no longer is what the cache was made from, or None."""
    path = Path(str(source.get("path")))
    if not path.exists():
        logger.warning(
            "mm_data: the cache's source metadata %s is not here; whether it changed since the cache was made "
            "is not checked", path,
        )  # fmt: skip
        return None
    now = source_sha256(path)
    if now == source.get("sha256"):
        return None
    return (
        f"the source metadata {path} changed since the cache was made (SHA-256 {str(source.get('sha256'))[:16]}"
        f"... then, {now[:16]}... now; {source.get('rows')} rows then): the cache holds the samples of the "
        "file as it was"
    )


def check_cache_made_with(root: str | Path, recipe: Mapping[str, Any]) -> None:
    """Refuse the cache ``root`` unless it records that it was made with ``recipe`` (the same value for every
    key) from a source metadata file that is unchanged since (see the module docstring).

    Raises:
        CacheMismatchError: naming every differing key with the cache's and the run's value, a changed
            source, or that the cache records no recipe; each with what to do.
        FileNotFoundError: ``root`` holds no cache.
    """
    root = Path(root)
    record = cache_made_with(root)
    redo = "run the preprocess with this config again (it encodes only what changed)"
    if record is None or record.get("recipe") is None:
        raise CacheMismatchError(
            f"{root}: cannot check this cache against the run's preprocess section: it records no recipe "
            f"(written by an earlier mm-data, or not by a preprocess command). To check it, {redo}: an "
            "index of an earlier version is rewritten without encoding anything, other caches are encoded "
            "into the sharded layout. To train on it unchecked, remove the preprocess section from the "
            "run's config"
        )
    problems = recipe_differences(record["recipe"], recipe)
    changed = _source_change(record.get("source") or {})
    if changed:
        problems.append(changed)
    if problems:
        lines = "\n  ".join(problems)
        raise CacheMismatchError(
            f"{root} was not made as this run says:\n  {lines}\nTo train on what the run says, {redo}; "
            "else change back what differs"
        )
