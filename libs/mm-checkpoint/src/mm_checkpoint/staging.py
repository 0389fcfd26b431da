"""Copy weights from shared storage to a node-local disk once per node, for slow shared file systems.

On every node the rank with ``LOCAL_RANK`` 0 copies; every rank then waits for all nodes (one
collective that also carries each copier's outcome, so that a failed copy raises on every rank
instead of leaving the others blocked). A copy is made into a temporary sibling and renamed into
place, with a record of the source's files (relative names, sizes, modification times) inside it
(``.mm_stage.json``); a later run reuses a copy whose record matches the source and replaces one
that does not. The copy of a source lives at ``<stage root>/<name>-<hash of its resolved path>``. The
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

from .runtime import is_distributed
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


def source_files(source: Path) -> list[list]:
    """``[relative name, size, mtime_ns]`` of every file of ``source`` (a file or a directory), sorted."""
    if source.is_file():
        stat = source.stat()
        return [[source.name, stat.st_size, stat.st_mtime_ns]]
    files = []
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        stat = path.stat()
        files.append([path.relative_to(source).as_posix(), stat.st_size, stat.st_mtime_ns])
    return files


def staged_location(source: str | os.PathLike, stage_root: str | os.PathLike) -> Path:
    """The directory under ``stage_root`` that holds the copy of ``source``."""
    resolved = Path(source).resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    return Path(stage_root) / f"{resolved.name}-{digest}"


def _record(source: Path) -> dict:
    return {"source": str(source), "files": source_files(source)}


def _is_current(copy_dir: Path, record: dict) -> bool:
    try:
        return json.loads((copy_dir / STAGE_RECORD).read_text()) == record
    except (OSError, ValueError):
        return False


def _copy(source: Path, copy_dir: Path) -> bool:
    """Make ``copy_dir`` a current copy of ``source``; False when one was already there."""
    record = _record(source)
    if _is_current(copy_dir, record):
        return False
    tmp = temporary_path(copy_dir)
    shutil.rmtree(tmp, ignore_errors=True)
    if source.is_file():
        tmp.mkdir(parents=True)
        shutil.copy2(source, tmp / source.name)
    else:
        shutil.copytree(source, tmp)
    (tmp / STAGE_RECORD).write_text(json.dumps(record))
    if copy_dir.exists():  # a copy of an older version of the source
        shutil.rmtree(copy_dir)
    try:
        os.rename(tmp, copy_dir)
    except OSError:  # another copier (nodes sharing the stage root) renamed its copy first
        shutil.rmtree(tmp, ignore_errors=True)
        if not _is_current(copy_dir, record):
            raise
    return True


def stage_on_node(source: str | os.PathLike, stage_root: str | os.PathLike) -> StagedCopy:
    """Copy ``source`` (a file or directory) under ``stage_root`` once per node; return where it is.

    Collective over the default process group when there is one (every rank calls it, in the same
    order); ``LOCAL_RANK`` 0 (torchrun, srun with its variables) copies. Raises ``OSError`` on every
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
        dist.all_gather_object(errors, error)
    failed = [e for e in errors if e]
    if failed:
        raise OSError("staging weights to node-local disk failed: " + "; ".join(failed))
    if copied:
        logger.info("staged %s to %s", src, copy_dir)
    return StagedCopy(src, copy_dir / src.name if src.is_file() else copy_dir, copied)


__all__ = ["STAGE_RECORD", "StagedCopy", "source_files", "stage_on_node", "staged_location"]
