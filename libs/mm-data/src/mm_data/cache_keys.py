"""Content keys of the latent cache: what a cached sample is a function of, hashed.

A sample's key is the SHA-256 of the canonical JSON of

- ``clip``: the SHA-256 of the clip's bytes (probed once, :func:`mm_data.clip_info`);
- ``row``: its metadata row but the path (caption(s) and every other column: what the encoder may read);
- ``bucket``: ``[height, width, frames]`` it is read at, and ``reading``: the clip reader's parameters
  (frame rate or stride, offset rule, first frame, seed and caption dropout);
- ``encoders``: the encoders' identity (their weights' digests, dtypes, options: given by the app);
- ``index``: the row's position, only when the encoder uses a prompt drawn per row from a caption list
  or with dropout (the draw is keyed by the index), else absent.

Why the clip's bytes and not a cheaper fingerprint (size + mtime, a partial hash): a key must change
exactly when the cached tensors would, a copied or re-synced dataset keeps its bytes but not its mtimes,
and a clip rewritten in place can keep its size and have its mtime restored (``rsync -t``, ``tar``,
``cp -p``). So every preprocess run hashes every clip again (:func:`mm_data.clip_digests`; the stored
size and mtime are a pre-filter that never alone decides that a clip is unchanged): one read of each
clip, SHA-256 at about 1.6 GB/s per process (measured in docs/DESIGN.md "Latent cache"), small beside
decoding and VAE-encoding it, and only a re-run that encodes nothing notices it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .file_records import FileRecords, sha256_file

__all__ = ["canonical_json", "content_key", "tree_digest"]


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: the same bytes for the same value on every run.

    Raises:
        TypeError: ``value`` holds something JSON cannot represent (a key must not depend on a repr).
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def content_key(parts: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the canonical JSON of ``parts``."""
    return hashlib.sha256(canonical_json(dict(parts)).encode()).hexdigest()


def _digest(path: str) -> dict[str, Any]:
    return {"sha256": sha256_file(path)}


def tree_digest(
    path: str | Path, records: FileRecords | None = None, *, workers: int | None = None, verify: bool = False
) -> str:
    """SHA-256 over every file under ``path`` (or of the file ``path``): its relative names and contents.

    ``records`` keeps each file's digest while its size and mtime are unchanged (a re-run does not
    read a 10 GB text encoder again), unless ``verify``: then every file is hashed again and the records
    only say which ones changed in place (:meth:`FileRecords.ensure`). Hidden files and ``*.lock``
    files are left out.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"{root}: not found (an encoder's weights are hashed into the cache keys)")
    files = [root] if root.is_file() else sorted(
        p for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
        and p.suffix != ".lock"
    )  # fmt: skip
    found = (records or FileRecords(None)).ensure(
        [str(p) for p in files], "sha256", _digest, workers=workers, verify=verify
    )
    listing = []
    for p in files:
        record = found[str(p)]
        if record is None:
            raise FileNotFoundError(
                f"{p}: cannot read it (an encoder's weights are hashed into the cache keys)"
            )
        listing.append([p.relative_to(root).as_posix() if p != root else p.name, record["sha256"]])
    return content_key({"files": listing})
