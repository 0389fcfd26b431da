"""Temporaries of node-local copies (``stage_on_node``): named for their copier, removed once it is gone.

A copy is written into a sibling ``<copy>.tmp-<host>-<pid>`` and renamed into place. A copier that
is killed (preemption, OOM, SIGKILL) leaves that folder behind, a whole model per interruption on
the node's disk. :func:`remove_stale_temporaries`, called by the next copier on the node before it
copies, removes every temporary under the stage root whose copier is no longer alive: the name
says which host and which process wrote it, so only temporaries of *this* host are judged (a stage
root shared by several nodes holds other hosts' live copies) and only when their process is gone
(another job copying on this node right now keeps its own). A reused pid counts as alive: such a
temporary is left for a later run, never removed under a live copier.

Two cleaners may meet (two jobs starting on one node): each first claims a stale temporary by
renaming it to a temporary of its own (``<stale>.tmp-<host>-<own pid>``), so exactly one removes it,
and a cleaner killed while removing leaves a temporary that the next run removes in turn.

Copies written before temporaries carried the host (``<copy>.tmp-<pid>``) are judged as this host's.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
from pathlib import Path

__all__ = ["remove_stale_temporaries", "temporary_path"]

logger = logging.getLogger(__name__)

_TEMPORARY = re.compile(r"^.+\.tmp-(?P<host>[A-Za-z0-9._-]+)-(?P<pid>\d+)$")
_LEGACY = re.compile(r"^.+\.tmp-(?P<pid>\d+)$")  # before the host was part of the name


def _host() -> str:
    """This host's name as it appears in temporaries (characters outside ``[A-Za-z0-9._-]`` -> ``_``)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "localhost"


def temporary_path(target: Path, pid: int | None = None) -> Path:
    """Where process ``pid`` (None: this one) of this host writes ``target`` before renaming it into
    place: ``<target>.tmp-<host>-<pid>``."""
    return target.with_name(f"{target.name}.tmp-{_host()}-{os.getpid() if pid is None else pid}")


def _pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (one of another user counts as alive)."""
    if pid <= 0:
        return True  # not a process id we could judge: keep
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stale(name: str) -> bool:
    """Whether ``name`` is a temporary of a copier of this host that is no longer alive."""
    match = _TEMPORARY.match(name)
    if match:
        return match["host"] == _host() and not _pid_alive(int(match["pid"]))
    legacy = _LEGACY.match(name)
    return bool(legacy) and not _pid_alive(int(legacy["pid"]))


def remove_stale_temporaries(stage_root: str | os.PathLike) -> list[Path]:
    """Remove the temporaries under ``stage_root`` left by copiers of this host that are gone; return them.

    Safe beside live copiers (on this node or, with a shared stage root, on others) and beside another
    cleaner: see the module docstring. A temporary that cannot be removed is logged and left.
    """
    root = Path(stage_root)
    if not root.is_dir():
        return []
    removed = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(".") or not _stale(entry.name):
            continue
        claimed = temporary_path(entry)
        try:
            os.rename(entry, claimed)  # one cleaner wins; the others find it gone
        except FileNotFoundError:
            continue
        except OSError as exc:
            logger.warning("could not remove the stale staging temporary %s: %s", entry, exc)
            continue
        if claimed.is_dir() and not claimed.is_symlink():
            shutil.rmtree(claimed, ignore_errors=True)
        else:
            claimed.unlink(missing_ok=True)
        logger.info("removed the staging temporary %s of an interrupted copy", entry)
        removed.append(entry)
    return removed
