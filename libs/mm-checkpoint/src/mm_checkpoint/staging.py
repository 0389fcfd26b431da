"""Copy weights from shared storage to a node-local disk once per node, for slow shared file systems.

On every node the rank with ``LOCAL_RANK`` 0 copies; every rank then waits for all nodes (one
collective that also carries each copier's outcome, so that a failed copy raises on every rank
instead of leaving the others blocked). A copy is made into a temporary sibling and renamed into
place, with a record of the source's files inside it (``.mm_stage.json``: relative names and a
SHA-256 of each file's bytes, :mod:`.source_identity`); a later run reuses a copy whose record
matches the source's content and replaces one that does not. Hashes are computed while copying (the
source is read once) and reused while a file's size, times and inode are unchanged. The copy of a
source lives at ``<stage root>/<name>-<hash of its resolved path>``. The
temporaries of copies that were interrupted are removed by the node's next copier
(:mod:`mm_checkpoint.stage_temporaries`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from .runtime import is_distributed, long_wait_group
from .source_identity import IDENTITY_VERSION, content_of, files_identity
from .stage_temporaries import remove_stale_temporaries, temporary_path

logger = logging.getLogger(__name__)

STAGE_RECORD = ".mm_stage.json"
"""The record of a staged copy's source, inside the copy (hidden: loaders ignore it)."""


@dataclass(frozen=True)
class StagedCopy:
    """Where ``source`` was staged (``path``: the copied file or directory) and whether this rank copied it."""

    source: Path
    path: Path
    copied: bool


def source_files(source: Path) -> list[tuple[Path, str]]:
    """``(path, relative name)`` of every file of ``source`` (a file or a directory), sorted by name."""
    if source.is_file():
        return [(source, source.name)]
    return [
        (p, p.relative_to(source).as_posix()) for p in sorted(p for p in source.rglob("*") if p.is_file())
    ]


def staged_location(source: str | os.PathLike, stage_root: str | os.PathLike) -> Path:
    """The directory under ``stage_root`` that holds the copy of ``source``."""
    resolved = Path(source).resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    return Path(stage_root) / f"{resolved.name}-{digest}"


def _read_record(copy_dir: Path) -> dict | None:
    try:
        record = json.loads((copy_dir / STAGE_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("files"), list) else None


def _write_record(copy_dir: Path, source: Path, files: list[dict]) -> None:
    tmp = copy_dir / f"{STAGE_RECORD}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"version": IDENTITY_VERSION, "source": str(source), "files": files}))
    os.replace(tmp, copy_dir / STAGE_RECORD)


def _current_copy(source: Path, copy_dir: Path) -> bool:
    """Whether ``copy_dir`` holds a copy of ``source``'s current content (hashing only the files whose
    size, times or inode changed since the record; a record refreshed when only those changed)."""
    record = _read_record(copy_dir)
    if record is None or record.get("version") != IDENTITY_VERSION:
        return False
    current = files_identity(source_files(source), record["files"])
    if content_of(current) != content_of(record["files"]):
        return False
    if current != record["files"]:
        _write_record(copy_dir, source, current)
    return True


def _copy_hashing(source: Path, target: Path, records: list[dict]) -> None:
    """Copy the file ``source`` to ``target`` (data and times), recording its identity from the bytes
    read: the stat taken before the copy, the hash of what was copied."""
    stat = source.stat()
    digest = hashlib.sha256()
    with open(source, "rb") as src, open(target, "wb") as dst:
        while chunk := src.read(1 << 24):
            digest.update(chunk)
            dst.write(chunk)
    shutil.copystat(source, target)
    records.append({"name": source.name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                    "ctime_ns": stat.st_ctime_ns, "inode": stat.st_ino, "sha256": digest.hexdigest()})  # fmt: skip


def _copy(source: Path, copy_dir: Path) -> bool:
    """Make ``copy_dir`` a current copy of ``source``; False when one was already there."""
    if _current_copy(source, copy_dir):
        return False
    tmp = temporary_path(copy_dir)
    shutil.rmtree(tmp, ignore_errors=True)
    records: list[dict] = []
    if source.is_file():
        tmp.mkdir(parents=True)
        _copy_hashing(source, tmp / source.name, records)
    else:

        def copy(src: str, dst: str) -> None:
            _copy_hashing(Path(src), Path(dst), records)
            records[-1]["name"] = Path(src).relative_to(source).as_posix()

        shutil.copytree(source, tmp, copy_function=copy)
    _write_record(tmp, source, sorted(records, key=lambda r: r["name"]))
    if copy_dir.exists():  # a copy of an older version of the source
        shutil.rmtree(copy_dir)
    try:
        os.rename(tmp, copy_dir)
    except OSError:  # another copier (nodes sharing the stage root) renamed its copy first
        shutil.rmtree(tmp, ignore_errors=True)
        if not _current_copy(source, copy_dir):
            raise
    return True


def stage_on_node(source: str | os.PathLike, stage_root: str | os.PathLike) -> StagedCopy:
    """Copy ``source`` (a file or directory) under ``stage_root`` once per node; return where it is.

    Collective over the default process group when there is one, or the :func:`~mm_checkpoint.runtime.long_waits`
    group (every rank calls it, in the same order); ``LOCAL_RANK`` 0 (torchrun, srun with its variables) copies. Raises ``OSError`` on every
    rank, naming the source and the node's copier, when a copy failed.
    """
    src = Path(source)
    if not src.exists():
        raise FileNotFoundError(f"cannot stage {src}: it does not exist")
    copy_dir = staged_location(src, stage_root)
    copied, error = False, None
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        try:
            remove_stale_temporaries(copy_dir.parent)  # left by interrupted copies (stage_temporaries)
            copied = _copy(src.resolve(), copy_dir)
        except OSError as exc:  # raised below on every rank
            error = f"rank {os.environ.get('RANK', '0')} could not copy {src} to {copy_dir}: {exc}"
    errors = [error]
    if is_distributed():
        errors = [None] * dist.get_world_size()
        dist.all_gather_object(errors, error, group=long_wait_group())
    failed = [e for e in errors if e]
    if failed:
        raise OSError("staging weights to node-local disk failed: " + "; ".join(failed))
    if copied:
        logger.info("staged %s to %s", src, copy_dir)
    return StagedCopy(src, copy_dir / src.name if src.is_file() else copy_dir, copied)


__all__ = ["STAGE_RECORD", "StagedCopy", "source_files", "stage_on_node", "staged_location"]
