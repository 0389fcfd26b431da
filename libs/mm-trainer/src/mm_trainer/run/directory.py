"""A run owns its directories: it locks them, and a save dir that holds a run is resumed, not overwritten.

Where a run starts (``training.resume``, default ``auto``):

==========================  ====================  ============================  ========================
``training.save`` holds     ``auto``              ``must``                      ``never``
==========================  ====================  ============================  ========================
a checkpoint                resume it             resume it                     move it aside, start
a run without a checkpoint  start (``load`` or    resume ``load``; error        move it aside, start
(metrics, iter_* parts)     pretrained)           without one
other files only            start (``load`` or    resume ``load``; error        error: not a run
                            pretrained)           without one
nothing / does not exist    start                 resume ``load``; error        start
                                                  without one
==========================  ====================  ============================  ========================

"start" means from ``training.load`` when it is set (its model, optimizer, data position... as
before), else from the pretrained weights. A run continuing in its own save dir ignores
``training.load``: that is where the run started, not where it is. Starting over in a dir that holds
a run is the explicit ``never``, and it deletes nothing: the whole directory is renamed to
``<save>.previous-<timestamp>`` (one atomic rename, instant at any size, on the same file system) so
that the new run's tracker, ``keep_last`` and ``metrics.jsonl`` only ever see its own files. A folder
that holds no run (a model, a data set) is never renamed away: ``never`` refuses it.

A separate ``training.log_dir`` is owned the same way, since a new run would truncate the
``metrics.jsonl`` and TensorBoard events it finds there. The run records its save dir in it
(``.mm_train_run.json``); logs of another run (another save dir, or a run without one) are refused
with ``auto`` / ``must`` and moved aside with ``never``; the logs of the run being resumed (or, for
logs that predate the record, of a run resuming in place) are continued.

Rank 0 takes the locks and decides; every rank gets the same answer, or the same error.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mm_checkpoint import TRACKER_FILENAME, latest_iteration
from mm_checkpoint.runtime import on_rank0

from mm_trainer.run.lock import DEFAULT_LEASE_S, LOCK_FILENAME, RunLock

logger = logging.getLogger("mm_trainer")


RUN_OWNER_FILENAME = ".mm_train_run.json"
"""In a separate ``training.log_dir``: the save dir of the run whose logs it holds."""
RUN_LOG_NAMES = ("metrics.jsonl", "tensorboard", "wandb", RUN_OWNER_FILENAME)
"""What a run writes into its log dir that the next run would truncate or purge."""


class RunDirectoryError(RuntimeError):
    """``training.resume`` cannot be honoured with what ``training.save`` / ``training.log_dir`` /
    ``training.load`` hold."""


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


def _contents(directory: Path) -> list[str]:
    if not directory.is_dir():
        return []
    return sorted(p.name for p in directory.iterdir() if p.name != LOCK_FILENAME)


def _holds_anything(directory: Path) -> bool:
    return bool(_contents(directory))


def holds_a_run(directory: Path) -> bool:
    """Whether ``directory`` holds (part of) a training run: a checkpoint tracker, ``iter_*`` /
    ``release`` directories (complete or not), or a run's logs (``metrics.jsonl``, TensorBoard events)."""
    names = _contents(directory)
    return any(n in (TRACKER_FILENAME, "release", *RUN_LOG_NAMES) or n.startswith("iter_") for n in names)


def _refuse_not_a_run(directory: Path, key: str) -> None:
    shown = ", ".join(_contents(directory)[:6])
    raise RunDirectoryError(
        f"training.resume=never moves aside a {key} that holds a run, but {directory} holds no run "
        f"(no checkpoint, tracker or metrics; it holds {shown}): nothing was moved. Choose an empty or new "
        f"training.{key}"
    )


def _same(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()


def plan_start(save: Path | None, load: Path | None, mode: str) -> tuple[Path | None, bool]:
    """``(checkpoint root to resume from or None, whether to move the save dir aside first)``.

    Raises:
        RunDirectoryError: ``must`` with nothing to resume; ``never`` with ``load`` inside ``save``, or
            with a ``save`` that holds files but no run.
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
    if move and not holds_a_run(save):  # type: ignore[arg-type]
        _refuse_not_a_run(save, "save")  # type: ignore[arg-type]
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


def plan_log_dir(log_dir: Path, save: Path | None, resume_from: Path | None, mode: str) -> bool:
    """Whether the separate log dir ``log_dir`` must be moved aside first (``never`` and it holds run
    logs); its logs may be continued, or it is fresh.

    Raises:
        RunDirectoryError: it holds another run's logs (``auto`` / ``must``), or with ``never`` files but
            no run, or ``save`` inside it.
    """
    if mode == "never":
        if not _holds_anything(log_dir):
            return False
        if not holds_a_run(log_dir):
            _refuse_not_a_run(log_dir, "log_dir")
        if save is not None and save.resolve().is_relative_to(log_dir.resolve()):
            raise RunDirectoryError(
                f"training.resume=never would move training.log_dir {log_dir} aside with training.save {save} "
                "inside it: keep the save dir out of the log dir (e.g. runs/x/ckpt and runs/x/logs)"
            )
        return True
    if not any(n in RUN_LOG_NAMES for n in _contents(log_dir)):
        return False
    owner = _log_owner(log_dir)
    ours = str(save.resolve()) if save is not None else None
    if ours is not None and (
        owner == ours or (owner is None and resume_from is not None and _same(resume_from, save))
    ):
        return False  # this run's logs (records after its checkpoint are dropped when it starts)
    whose = (
        f"the run saving to {owner}"
        if owner
        else "another run (one with no save dir, or from before runs recorded it)"
    )
    raise RunDirectoryError(
        f"training.log_dir {log_dir} holds the metrics of {whose}, which this run would truncate: choose "
        "another training.log_dir, or set training.resume=never to move them aside"
    )


def _log_owner(log_dir: Path) -> str | None:
    try:
        owner = json.loads((log_dir / RUN_OWNER_FILENAME).read_text()).get("save")
    except (OSError, ValueError, AttributeError):
        return None
    return owner if isinstance(owner, str) else None


def _claim_log_dir(log_dir: Path, save: Path | None) -> None:
    """Record in ``log_dir`` whose logs it holds (written beside and renamed: never half a record)."""
    tmp = log_dir / f"{RUN_OWNER_FILENAME}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"save": str(save.resolve()) if save is not None else None}) + "\n")
    os.replace(tmp, log_dir / RUN_OWNER_FILENAME)


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
    save: Path | None, log_dir: Path | None, load: Path | None, mode: str, lease_s: float = DEFAULT_LEASE_S
) -> tuple[RunStart, list[RunLock]]:
    """Rank 0: lock, decide, move aside if asked. Locks are released again on failure."""
    locks: list[RunLock] = []

    def lock(directory: Path) -> RunLock:
        return RunLock(directory, lease_s).acquire()

    try:
        if save is not None:
            locks.append(lock(save))
        resume_from, move = plan_start(save, load, mode)
        moved = None
        if move:
            assert save is not None
            locks.pop().held = False  # its lock file leaves with the directory (and is deleted there)
            moved = _move_aside(save)
            logger.warning("training.resume=never: moved the previous run in %s to %s", save, moved)
            locks.append(lock(save))
        if log_dir is not None and (save is None or not log_dir.resolve().is_relative_to(save.resolve())):
            locks.append(lock(log_dir))
            if plan_log_dir(log_dir, save, resume_from, mode):
                locks.pop().held = False
                moved_logs = _move_aside(log_dir)
                logger.warning(
                    "training.resume=never: moved the previous run's logs in %s to %s", log_dir, moved_logs
                )
                locks.append(lock(log_dir))
            _claim_log_dir(log_dir, save)
        return RunStart(resume_from, moved), locks
    except BaseException:
        for taken in locks:
            taken.release()
        raise


def open_run_directory(training: Any) -> RunDirectory:
    """Lock ``training.save`` and ``training.log_dir`` for this run and decide where it starts.

    Collective: call on every rank. Rank 0 does the file system work; all ranks return the same
    :class:`RunStart` (or raise the same error: :class:`~mm_trainer.run.lock.RunLockedError`,
    :class:`RunDirectoryError`...).
    """
    paths = [Path(p) if p else None for p in (training.save, training.log_dir, training.load)]
    held: list[RunLock] = []

    def prepare() -> RunStart:
        start, locks = _prepare(*paths, mode=training.resume, lease_s=training.lock_lease_s)
        held.extend(locks)
        return start

    return RunDirectory(on_rank0(prepare), held)
