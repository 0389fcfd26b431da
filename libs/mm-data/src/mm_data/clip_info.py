"""Clip facts probed once: frame count, frame rate, size (from the container header) and, for the latent
cache, the SHA-256 of the clip's bytes; stored beside the metadata file and reused while the clips are
unchanged (:class:`~mm_data.file_records.FileRecords`: valid while a clip's size and mtime are). The
latent cache asks for the digests with ``verify`` (:func:`clip_digests`): every clip is hashed again on
every preprocess run, so a clip rewritten in place with its size and mtime kept is seen by its content.

``metadata.json`` gets ``metadata.json.clips.json``; a caption folder (:mod:`mm_data.caption_folder`) keeps
them inside, in ``.clips.json`` (a hidden name: never read as a sample). Every process that needs the facts (each rank of a
run assigning buckets, each rank of a preprocess) asks :func:`clip_info`; the first one probes what is
missing in parallel processes, under the store's lock, and the others read its results.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .decode import DecodeError, VideoInfo, probe_video
from .file_records import FileRecords, sha256_file

__all__ = ["clip_digests", "clip_info", "clip_info_path", "record_info"]


def clip_info_path(metadata_path: str | Path) -> Path:
    """Where the probed facts of ``metadata_path``'s clips are stored: ``<metadata file>.clips.json``, or
    ``<caption folder>/.clips.json``."""
    path = Path(metadata_path)
    if path.is_dir():
        return path / ".clips.json"
    return path.with_name(f"{path.name}.clips.json")


def _probe(path: str) -> dict[str, Any]:
    try:
        info = probe_video(path)
    except DecodeError as e:
        return {"probe": None, "probe_error": str(e)}
    return {"probe": [info.num_frames, info.fps, info.height, info.width]}


def _digest(path: str) -> dict[str, Any]:
    try:
        return {"sha256": sha256_file(path)}
    except OSError as e:
        return {"sha256": None, "sha256_error": f"{path}: cannot read: {e}"}


def record_info(record: dict[str, Any] | None) -> VideoInfo | None:
    """The :class:`VideoInfo` of a :func:`clip_info` record; None for a clip that could not be probed."""
    if not record or not record.get("probe"):
        return None
    frames, fps, height, width = record["probe"]
    return VideoInfo(int(frames), float(fps), int(height), int(width))


def clip_info(
    paths: Sequence[str],
    *,
    metadata_path: str | Path | None,
    probe: bool = True,
    digests: bool = False,
    workers: int | None = None,
    prune: bool = False,
) -> dict[str, dict[str, Any] | None]:
    """Probed header facts (``probe``: ``[frames, fps, height, width]`` or None + ``probe_error``) and,
    with ``digests``, ``sha256`` of each clip in ``paths``; None for a clip that cannot be stat'ed.

    Args:
        paths: Clip (or image) files, as the metadata rows name them (absolute).
        metadata_path: The metadata file the facts are stored beside, or the caption folder they are
            stored in (None: not stored).
        probe: Read the container headers.
        digests: Hash every clip's bytes (the latent cache's content keys).
        workers: Processes probing / hashing in parallel (default: the CPUs, at most 8).
        prune: ``paths`` are all the metadata's clips: forget the stored facts of any other file.
    """
    store = FileRecords(clip_info_path(metadata_path) if metadata_path is not None else None)
    unique = list(dict.fromkeys(paths))
    records: dict[str, dict[str, Any] | None] = {p: None for p in unique}
    if probe:
        records = store.ensure(unique, "probe", _probe, workers=workers, prune=prune)
    if digests:
        records = store.ensure(unique, "sha256", _digest, workers=workers, prune=prune)
    return records


def clip_digests(
    paths: Sequence[str], *, metadata_path: str | Path | None, workers: int | None = None
) -> tuple[dict[str, dict[str, Any] | None], list[str]]:
    """The SHA-256 of every clip in ``paths`` (all of a metadata file's clips), each hashed from its bytes
    now, in ``workers`` processes; and the clips found changed under an unchanged size and mtime.

    What the latent cache keys samples by: the stored digest of a clip is never trusted on its stat
    alone (a rewrite that restores the mtime keeps both). Costs one read of every clip per call (SHA-256
    at about 1.6 GB/s per process on the machine of docs/DESIGN.md "Latent cache"; reading the files
    from disk usually bounds it).
    """
    store = FileRecords(clip_info_path(metadata_path) if metadata_path is not None else None)
    unique = list(dict.fromkeys(paths))
    records = store.ensure(unique, "sha256", _digest, workers=workers, prune=True, verify=True)
    return records, list(store.rewritten)
