"""A run owns its directories: it locks them, and a save dir that holds a run is resumed, not overwritten.

Where a run starts (``training.resume``, default ``auto``):

==========================  ====================  ============================  ========================
``training.save`` holds     ``auto``              ``must``                      ``never``
==========================  ====================  ============================  ========================
a checkpoint                resume it             resume it                     move it aside, start
other files only            start (``load`` or    resume ``load``; error        move it aside, start
                            pretrained)           without one
nothing / does not exist    start                 resume ``load``; error        start
                                                  without one
==========================  ====================  ============================  ========================

"start" means from ``training.load`` when it is set (its model, optimizer, data position... as
before), else from the pretrained weights. A run continuing in its own save dir ignores
``training.load``: that is where the run started, not where it is. Starting over in a dir that holds
a run is the explicit ``never``, and it deletes nothing: the whole directory is renamed to
``<save>.previous-<timestamp>`` (one atomic rename, instant at any size, on the same file system) so
that the new run's tracker, ``keep_last`` and ``metrics.jsonl`` only ever see its own files.

Rank 0 takes the locks and decides; every rank gets the same answer, or the same error.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mm_checkpoint import latest_iteration
from mm_checkpoint.runtime import on_rank0

from mm_trainer.run_lock import LOCK_FILENAME, RunLock

logger = logging.getLogger("mm_trainer")


class RunDirectoryError(RuntimeError):
    """``training.resume`` cannot be honoured with what ``training.save`` / ``training.load`` hold."""


@dataclass
class RunStart:
    """Where a run starts: ``resume_from`` (a checkpoint root, None = pretrained weights) and, with
    ``training.resume: never``, where the previous run in the save dir was moved."""

    resume_from: Path | None
    moved_aside: Path | None = None


@dataclass
class RunDirectory:
    """The directories a run writes (save dir and log dir), locked for it, and where it starts."""

    start: RunStart
    locks: list[RunLock] = field(default_factory=list)

    @property
    def resume_from(self) -> Path | None:
        return self.start.resume_from

    def release(self) -> None:
        """Release the locks (rank 0; a no-op elsewhere). Also runs at interpreter exit."""
        for lock in self.locks:
            lock.release()


def _holds_anything(directory: Path) -> bool:
    return directory.is_dir() and any(p.name != LOCK_FILENAME for p in directory.iterdir())


def _same(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()


def plan_start(save: Path | None, load: Path | None, mode: str) -> tuple[Path | None, bool]:
    """``(checkpoint root to resume from or None, whether to move the save dir aside first)``.

    Raises:
        RunDirectoryError: ``must`` with nothing to resume; ``never`` with ``load`` inside ``save``.
        AmbiguousCheckpointError: ``save`` holds several checkpoints and no tracker.
    """
    has_run = save is not None and save.is_dir() and latest_iteration(save) is not None
    if has_run and mode != "never":
        if load is not None and not _same(load, save):
            logger.warning(
                "training.save %s holds this run: resuming it (training.load %s ignored)", save, load
            )
        return save, False
    move = mode == "never" and save is not None and _holds_anything(save)
    if move and load is not None and _same(load, save):
        raise RunDirectoryError(
            f"training.resume=never starts a new run and moves {save} aside, but training.load points "
            "at it: set training.load to the moved directory, or use training.resume=auto to continue"
        )
    if load is None and mode == "must":
        raise RunDirectoryError(
            f"training.resume=must but there is nothing to resume: training.save {save} holds no "
            "checkpoint and training.load is unset"
        )
    return load, move


def _move_aside(save: Path) -> Path:
    """Rename ``save`` to a free ``<save>.previous-<timestamp>[-N]`` next to it."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = save.with_name(f"{save.name}.previous-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = save.with_name(f"{save.name}.previous-{stamp}-{n}")
    os.rename(save, target)
    (target / LOCK_FILENAME).unlink(missing_ok=True)  # ours, moved along
    return target


def _prepare(
    save: Path | None, log_dir: Path | None, load: Path | None, mode: str
) -> tuple[RunStart, list[RunLock]]:
    """Rank 0: lock, decide, move aside if asked. Locks are released again on failure."""
    locks: list[RunLock] = []
    try:
        if save is not None:
            locks.append(RunLock(save).acquire())
        resume_from, move = plan_start(save, load, mode)
        moved = None
        if move:
            assert save is not None
            locks.pop().held = False  # its lock file leaves with the directory (and is deleted there)
            moved = _move_aside(save)
            logger.warning("training.resume=never: moved the previous run in %s to %s", save, moved)
            locks.append(RunLock(save).acquire())
        if log_dir is not None and (save is None or not _same(log_dir, save)):
            locks.append(RunLock(log_dir).acquire())
        return RunStart(resume_from, moved), locks
    except BaseException:
        for lock in locks:
            lock.release()
        raise


def open_run_directory(training: Any) -> RunDirectory:
    """Lock ``training.save`` and ``training.log_dir`` for this run and decide where it starts.

    Collective: call on every rank. Rank 0 does the file system work; all ranks return the same
    :class:`RunStart` (or raise the same error: :class:`~mm_trainer.run_lock.RunLockedError`,
    :class:`RunDirectoryError`...).
    """
    paths = [Path(p) if p else None for p in (training.save, training.log_dir, training.load)]
    held: list[RunLock] = []

    def prepare() -> RunStart:
        start, locks = _prepare(*paths, mode=training.resume)
        held.extend(locks)
        return start

    return RunDirectory(on_rank0(prepare), held)
