"""The destination folder of an export: checked before anything is written, replaced whole after.

Every export writer (``export_checkpoint`` / ``mm-ckpt convert``, ``convert_to_dcp``, the LoRA exports,
the apps' and the HF path's exports) writes through :func:`export_into`:

- the destination may not overlap what the export reads (the same folder, one inside the other):
  refused before anything is written;
- it must be absent, empty, or a folder an earlier export wrote (its ``.mm_export.json`` lists every
  file in it); a folder holding anything else (a model, a run, a file of the user's) is refused,
  naming what it holds, since replacing it would delete that;
- the export writes into a fresh sibling folder, which then replaces the destination whole. So the
  shards and index of an older export are gone, as ``save_pretrained`` removes the stale shards it
  replaces (a loader would otherwise read an old index, or an old shard beside new ones), and an
  export that fails leaves the older one as it was. The two renames of the swap are not one atomic
  step: a crash between them leaves the old export as ``.<name>.replaced-export`` beside the missing
  destination.

The folder's contents are the writer's business (names, sharding, side files); this module only
decides where they go.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import CheckpointError
from .runtime import barrier, get_rank, on_rank0

EXPORT_RECORD = ".mm_export.json"
"""The list of files an export wrote, inside its folder (hidden: loaders ignore it)."""


class ExportDestinationError(CheckpointError, ValueError):
    """The destination of an export overlaps its source, or holds files no export wrote."""


def check_no_overlap(out: str | os.PathLike, sources: Iterable[str | os.PathLike | None]) -> None:
    """Refuse a destination that is, holds or lies inside one of ``sources`` (what the export reads)."""
    target = Path(out).resolve()
    for source in sources:
        if source is None:
            continue
        src = Path(source).resolve()
        if target == src or src.is_relative_to(target) or target.is_relative_to(src):
            where = "is" if target == src else ("holds" if src.is_relative_to(target) else "lies inside")
            raise ExportDestinationError(
                f"export destination {out} {where} its source {source}: nothing was written; choose a "
                "folder outside the source"
            )


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir())


def _recorded(folder: Path) -> list[str] | None:
    try:
        files = json.loads((folder / EXPORT_RECORD).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    return files if isinstance(files, list) else None


def check_destination(out: str | os.PathLike, sources: Iterable[str | os.PathLike | None] = ()) -> None:
    """Raise :class:`ExportDestinationError` unless ``out`` may receive an export reading ``sources``:
    no overlap, and absent, empty, or holding only what an earlier export recorded."""
    check_no_overlap(out, sources)
    folder = Path(out)
    if not folder.exists():
        return
    if not folder.is_dir():
        raise ExportDestinationError(f"export destination {out} is a file; an export writes a folder")
    present = _files(folder)
    if not present:
        return
    recorded = _recorded(folder)
    foreign = [f for f in present if f != EXPORT_RECORD and (recorded is None or f not in recorded)]
    if foreign:
        what = (
            "files no export wrote"
            if recorded is not None
            else f"files and no {EXPORT_RECORD} (not an export)"
        )
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ExportDestinationError(
            f"export destination {out} holds {what}: {shown}. An export replaces its folder whole: choose an "
            "empty or new folder, or move those files away"
        )


def _commit(staging: Path, out: Path) -> None:
    """Record what ``staging`` holds, then put it in the place of ``out`` (rank 0). A failure puts the
    older export back where it was."""
    (staging / EXPORT_RECORD).write_text(json.dumps({"files": _files(staging)}, indent=1) + "\n")
    replaced = out.with_name(f".{out.name}.replaced-export")
    shutil.rmtree(replaced, ignore_errors=True)
    if out.exists():
        os.rename(out, replaced)
    try:
        os.rename(staging, out)
    except BaseException:
        if replaced.exists() and not out.exists():
            os.rename(replaced, out)
        raise
    shutil.rmtree(replaced, ignore_errors=True)


@contextmanager
def export_into(
    out: str | os.PathLike, *, sources: Iterable[str | os.PathLike | None] = ()
) -> Iterator[Path]:
    """Check ``out`` (:func:`check_destination`), yield an empty sibling folder to write the export
        into, and on success replace ``out`` by it whole; on failure (of the writer, of another rank, or of
    the swap itself) remove it (``out`` as it was).

        Collective when a process group exists: every rank enters it (rank 0 checks, creates and commits;
        the others wait for it), so a writer inside may gate its own work by rank and call barriers.
    """
    out = Path(out)
    staging = out.with_name(f".{out.name}.partial-export")
    srcs = list(sources)

    def prepare() -> None:
        check_destination(out, srcs)
        shutil.rmtree(staging, ignore_errors=True)  # left by an export that was killed
        staging.mkdir(parents=True)

    on_rank0(prepare)  # raises on every rank
    try:
        yield staging
        barrier()
        if get_rank() == 0:
            _commit(staging, out)
    except BaseException:  # the writer, a rank, or the commit failed: no partial export stays behind
        if get_rank() == 0:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    barrier()


__all__ = ["EXPORT_RECORD", "ExportDestinationError", "check_destination", "check_no_overlap", "export_into"]
