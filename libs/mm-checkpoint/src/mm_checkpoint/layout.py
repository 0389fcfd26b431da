"""On-disk layout of DCP checkpoint roots: ``iter_NNNNNNN/`` dirs, ``release/`` and the tracker file.

A checkpoint root looks like::

    root/
      latest_checkpointed_iteration.txt   # tracker: "12" or "release"
      iter_0000012/.metadata              # a complete DCP checkpoint
      iter_0000012/__0_0.distcp ...

A directory is a *valid* checkpoint only if it contains DCP ``.metadata`` (written last by
``torch.distributed.checkpoint``), so a half-written or empty ``iter_*`` never counts.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import AmbiguousCheckpointError, CheckpointNotFoundError

TRACKER_FILENAME = "latest_checkpointed_iteration.txt"
METADATA_FILENAME = ".metadata"
RELEASE_DIRNAME = "release"
ITER_DIR_RE = re.compile(r"^iter_(\d+)$")
RELEASE_ITERATION = -1
"""Iteration number used for a ``release/`` directory."""


def iteration_dir_name(iteration: int) -> str:
    """``iter_0000012`` for 12; ``release`` for :data:`RELEASE_ITERATION`."""
    if iteration == RELEASE_ITERATION:
        return RELEASE_DIRNAME
    if iteration < 0:
        raise ValueError(f"iteration must be >= 0 (or RELEASE_ITERATION), got {iteration}")
    return f"iter_{iteration:07d}"


def is_dcp_dir(path: str | os.PathLike) -> bool:
    """True if ``path`` itself is a complete DCP checkpoint (has ``.metadata``)."""
    return (Path(path) / METADATA_FILENAME).is_file()


def _parse_iteration(name: str) -> int | None:
    if name == RELEASE_DIRNAME:
        return RELEASE_ITERATION
    m = ITER_DIR_RE.match(name)
    return int(m.group(1)) if m else None


def valid_iterations(root: str | os.PathLike) -> dict[int, Path]:
    """Map iteration -> directory for every ``iter_*``/``release`` subdir that holds DCP ``.metadata``."""
    root = Path(root)
    if not root.is_dir():
        return {}
    found: dict[int, Path] = {}
    for child in root.iterdir():
        it = _parse_iteration(child.name)
        if it is not None and child.is_dir() and is_dcp_dir(child):
            found[it] = child
    return dict(sorted(found.items()))


def read_tracker(root: str | os.PathLike) -> int | None:
    """Iteration named by the tracker file in ``root``, or None without a tracker."""
    tracker = Path(root) / TRACKER_FILENAME
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    if text == RELEASE_DIRNAME:
        return RELEASE_ITERATION
    try:
        return int(text)
    except ValueError:
        raise CheckpointNotFoundError(
            f"tracker file {tracker} holds {text!r}; expected an iteration number or 'release'"
        ) from None


def write_tracker(root: str | os.PathLike, iteration: int) -> None:
    """Atomically point the tracker of ``root`` at ``iteration`` (write temp file, fsync, rename)."""
    root = Path(root)
    tmp = root / f".{TRACKER_FILENAME}.tmp"
    text = RELEASE_DIRNAME if iteration == RELEASE_ITERATION else str(iteration)
    with open(tmp, "w") as f:
        f.write(text + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / TRACKER_FILENAME)
    _fsync_dir(root)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def looks_like_dcp_checkpoint_dir(path: str | os.PathLike) -> bool:
    """True only with real DCP content: a tracker, ``.distcp``/``.metadata`` files, or a valid ``iter_*``/``release``.

    An empty ``iter_*`` left by an interrupted conversion does not count, so the caller redoes it.
    """
    path = Path(path)
    if not path.is_dir():
        return False
    if (path / TRACKER_FILENAME).is_file() or is_dcp_dir(path):
        return True
    if any(p.suffix == ".distcp" for p in path.iterdir()):
        return True
    return bool(valid_iterations(path))


def latest_iteration(root: str | os.PathLike) -> int | None:
    """The iteration to resume from: the tracker's, else the single valid iteration dir, else None.

    Raises:
        AmbiguousCheckpointError: no tracker and several valid iteration dirs.
    """
    tracked = read_tracker(root)
    if tracked is not None:
        return tracked
    found = valid_iterations(root)
    if len(found) > 1:
        names = ", ".join(p.name for p in found.values())
        raise AmbiguousCheckpointError(
            f"{root} has no {TRACKER_FILENAME} and several valid checkpoints ({names}); "
            f"pass the iteration explicitly or write the tracker file"
        )
    return next(iter(found), None)


def resolve_dcp_dir(path: str | os.PathLike, iteration: int | None = None) -> tuple[Path, int | None]:
    """Find the DCP directory to read under ``path`` and its iteration.

    ``path`` may be a DCP dir itself (``.metadata`` inside) or a checkpoint root (tracker and/or
    ``iter_*``/``release`` subdirs). With ``iteration=None`` the tracker decides, else the single
    valid iteration dir.

    Raises:
        CheckpointNotFoundError: nothing valid to load, naming the directory and what was found.
        AmbiguousCheckpointError: several candidates and no tracker.
    """
    path = Path(path)
    if iteration is None and is_dcp_dir(path):
        return path, None
    if not path.is_dir():
        raise CheckpointNotFoundError(f"checkpoint directory {path} does not exist")
    if iteration is None:
        iteration = latest_iteration(path)
    if iteration is None:
        entries = sorted(p.name for p in path.iterdir())[:20]
        raise CheckpointNotFoundError(
            f"{path} holds no complete DCP checkpoint: no {TRACKER_FILENAME} and no iter_*/release dir "
            f"with {METADATA_FILENAME} (found: {entries or 'nothing'}); an interrupted save leaves such dirs"
        )
    target = path / iteration_dir_name(iteration)
    if not is_dcp_dir(target):
        valid = [p.name for p in valid_iterations(path).values()]
        raise CheckpointNotFoundError(
            f"{target} is not a complete DCP checkpoint (no {METADATA_FILENAME}); valid ones in {path}: {valid}"
        )
    return target, iteration
