"""What an online DCP conversion was made from, so that a cache of another or a changed source is
never used in its place.

The identity of a safetensors source is its resolved path, its weight files (names, sizes,
modification times), a SHA-256 over their headers (tensor names, dtypes, shapes, offsets: no tensor
data is read; for a ``.pth`` state dict, over its tensors' names, dtypes and shapes) and the key map applied (``model_type`` and a fingerprint of its rules and of the plan
it makes for these keys). A conversion records it in its ``mm_checkpoint.json``, written atomically
with the converted tensors; :func:`identity_change` says in words what differs.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from .formats import is_pth_file
from .key_map_registry import get_weight_transform
from .key_maps import WeightTransform
from .pth_io import PthReader
from .safetensors_io import read_header_bytes, weight_files
from .weight_readers import open_weights

IDENTITY_VERSION = 1
"""Bumped when the record's fields change; a record of another version counts as a change."""


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


def source_identity(path: str | os.PathLike, model_type: str | None = None) -> dict[str, Any]:
    """The identity record of the safetensors checkpoint (or ``.pth`` state dict) at ``path`` converted
    with ``model_type``."""
    root = Path(path).resolve()
    files = [root] if is_pth_file(root) else weight_files(root)
    headers = hashlib.sha256()
    listing = []
    for file in files:
        stat = file.stat()
        if is_pth_file(file):
            with PthReader(file) as pth:
                headers.update(file.name.encode() + b"\0" + pth.digest().encode())
        else:
            headers.update(file.name.encode() + b"\0" + read_header_bytes(file))
        listing.append({"name": file.name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns})
    with open_weights(root) as reader:
        keys = reader.keys()
    return {
        "version": IDENTITY_VERSION,
        "path": str(root),
        "files": listing,
        "header_sha256": headers.hexdigest(),
        "model_type": model_type,
        "key_map_sha256": key_map_fingerprint(get_weight_transform(model_type), keys),
    }


_FIELDS = (
    ("version", "the record format changed"),
    ("path", "the source path changed"),
    ("files", "the weight files changed (names, sizes or modification times)"),
    ("header_sha256", "the safetensors headers changed (tensor names, dtypes or shapes)"),
    ("model_type", "the model type (key map) changed"),
    ("key_map_sha256", "the key map's rules or plan changed"),
)


def identity_change(recorded: dict[str, Any] | None, current: dict[str, Any]) -> str | None:
    """None when ``recorded`` matches ``current``, else what differs, in words."""
    if not recorded:
        return (
            "it records no source identity (made by an older mm-checkpoint, or not by an online conversion)"
        )
    changes = []
    for key, words in _FIELDS:
        if recorded.get(key) != current.get(key):
            detail = f" ({recorded.get(key)} -> {current.get(key)})" if key in ("path", "model_type") else ""
            changes.append(words + detail)
    return "; ".join(changes) or None
