"""What weights were made from, by content, so that a cache or copy of another or a changed source is
never used in its place.

A file's identity is a SHA-256 of its bytes (a safetensors shard or a ``.pth`` state dict alike). Hashing a 28 GB model takes a while, so a record keeps,
beside each hash, the file's size, modification time, inode and change time (``ctime``, which no
user call can set back): the hash is computed once and reused while all four are unchanged, and
computed again otherwise. A rewrite that keeps the size and restores the modification time (common in
container images and reproducible archives, whose times are normalised) changes the inode or the
ctime, so it is hashed again and seen; a file that is only touched or copied hashes the same, so what
depends on it stays valid.

Two consumers record these: the online DCP conversion (:func:`source_identity`, kept in the cache's
``mm_checkpoint.json`` with the key map applied; :func:`identity_change` says in words what differs)
and node-local staging (:mod:`.staging`, kept in the copy's ``.mm_stage.json``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .formats import is_pth_file
from .key_map_registry import get_weight_transform
from .key_maps import WeightTransform
from .safetensors_io import weight_files
from .weight_readers import open_weights

IDENTITY_VERSION = 2
"""Bumped when the record's fields change; a record of another version counts as a change (version 1
identified files by size and modification time only)."""

STAT_FIELDS = ("size", "mtime_ns", "ctime_ns", "inode")
"""What must be unchanged for a recorded hash to be reused."""


def sha256_file(path: str | os.PathLike) -> str:
    """SHA-256 (hex) of the bytes of ``path``, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def _stat(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "inode": st.st_ino}


def file_identity(
    path: str | os.PathLike, name: str, previous: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``{"name", "size", "mtime_ns", "ctime_ns", "inode", "sha256"}`` of the file ``path``; the hash of
    ``previous`` (a record of the same file) is reused when its :data:`STAT_FIELDS` all match."""
    record: dict[str, Any] = {"name": name, **_stat(Path(path))}
    reusable = (
        previous is not None
        and "sha256" in previous
        and all(previous.get(k) == record[k] for k in STAT_FIELDS)
    )
    record["sha256"] = previous["sha256"] if reusable else sha256_file(path)  # type: ignore[index]
    return record


def files_identity(
    files: Iterable[tuple[Path, str]], previous: Iterable[Mapping[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """:func:`file_identity` of each ``(path, name)``, reusing the hashes of ``previous`` records by name."""
    known = {r.get("name"): r for r in previous or () if isinstance(r, Mapping)}
    return [file_identity(path, name, known.get(name)) for path, name in files]


def content_of(records: Iterable[Mapping[str, Any]]) -> list[tuple[Any, Any, Any]]:
    """``(name, size, sha256)`` of each record: what two records must share to be the same content."""
    return sorted((r.get("name"), r.get("size"), r.get("sha256")) for r in records)


def changed_names(recorded: Iterable[Mapping[str, Any]], current: Iterable[Mapping[str, Any]]) -> list[str]:
    """Names of the files whose content differs between two record lists (added and removed included)."""
    old = {r.get("name"): (r.get("size"), r.get("sha256")) for r in recorded}
    new = {r.get("name"): (r.get("size"), r.get("sha256")) for r in current}
    return sorted(str(n) for n in old.keys() | new.keys() if old.get(n) != new.get(n))


def key_map_fingerprint(transform: WeightTransform, keys: list[str]) -> str:
    """SHA-256 of a key map's description and of the plan it makes for ``keys``.

    The description is the rule table of a :class:`~mm_checkpoint.key_maps.KeyMapTransform` (patterns,
    replacements, tensor ops) or, for another transform, its class and its ``version`` attribute if it
    has one (bump that when its tensor functions change).
    """
    rules = getattr(transform, "rules", None)
    description = [type(transform).__qualname__, repr(rules), repr(getattr(transform, "version", None))]
    plan = sorted([target, list(p.sources)] for target, p in transform.plan_load(keys).items())
    return hashlib.sha256(json.dumps([description, plan]).encode()).hexdigest()


def source_files(root: Path) -> list[Path]:
    """The weight files of the source at ``root``: a ``.pth`` file itself, else its safetensors files."""
    return [root] if is_pth_file(root) else weight_files(root)


def source_identity(
    path: str | os.PathLike, model_type: str | None = None, *, recorded: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The identity record of the safetensors checkpoint (or ``.pth`` state dict) at ``path`` converted
    with ``model_type``.

    ``recorded`` (an earlier record of this source, e.g. the cache's) lends its file hashes where the
    files are provably unchanged (:func:`file_identity`), so an unchanged source is not read again.
    """
    root = Path(path).resolve()
    previous = recorded.get("files") if recorded and recorded.get("version") == IDENTITY_VERSION else None
    files = files_identity(((f, f.name) for f in source_files(root)), previous)
    with open_weights(root) as reader:
        keys = reader.keys()
    return {
        "version": IDENTITY_VERSION,
        "path": str(root),
        "files": files,
        "model_type": model_type,
        "key_map_sha256": key_map_fingerprint(get_weight_transform(model_type), keys),
    }


def identity_change(recorded: Mapping[str, Any] | None, current: Mapping[str, Any]) -> str | None:
    """None when ``recorded`` and ``current`` describe the same content converted the same way, else
    what differs, in words. Where the source lies is not compared: the same bytes elsewhere convert to
    the same tensors."""
    if not recorded:
        return (
            "it records no source identity (made by an older mm-checkpoint, or not by an online conversion)"
        )
    if recorded.get("version") != current.get("version"):
        return f"the record format changed (version {recorded.get('version')} -> {current.get('version')})"
    changes = []
    changed = changed_names(recorded.get("files") or [], current.get("files") or [])
    if changed:
        changes.append(f"the content of the weight files changed ({', '.join(changed)})")
    if recorded.get("model_type") != current.get("model_type"):
        changes.append(
            f"the model type (key map) changed ({recorded.get('model_type')} -> {current.get('model_type')})"
        )
    if recorded.get("key_map_sha256") != current.get("key_map_sha256"):
        changes.append("the key map's rules or plan changed")
    return "; ".join(changes) or None


def needs_refresh(recorded: Mapping[str, Any] | None, current: Mapping[str, Any]) -> bool:
    """True when ``current`` matches ``recorded`` in content but not in file times or inodes (a touched
    or copied source): writing it back spares the next check from hashing the files again."""
    return bool(recorded) and recorded.get("files") != current.get("files")  # type: ignore[union-attr]


__all__ = [
    "IDENTITY_VERSION",
    "STAT_FIELDS",
    "changed_names",
    "content_of",
    "file_identity",
    "files_identity",
    "identity_change",
    "key_map_fingerprint",
    "needs_refresh",
    "sha256_file",
    "source_identity",
]
