"""`FileRecords`: facts about files (a clip's header, a file's SHA-256) computed once and kept in a
JSON file, valid while the file's size and modification time are unchanged.

The store is read, completed and rewritten under an exclusive ``fcntl`` lock on ``<store>.lock``, so
the ranks (and DataLoader-less processes) of a job that ask for the same records at once compute them
once: the first to take the lock computes what is missing, in parallel over ``workers`` processes, and
the others then find every record valid (on a file system without ``flock`` they may compute the same
records; the last write wins). Writes are atomic (temporary file + rename). A store whose
folder cannot be written is skipped with a logged warning: the records are then computed in memory for
this process only (slower, never wrong).

The ``(size, mtime_ns)`` pair only decides whether a record is still *valid*; what is recorded (e.g. the
content digest) is computed from the file itself. A file rewritten in place with its size and mtime kept
(``rsync -t``, ``tar``, ``cp -p`` restore the mtime) would keep a stale record: where that must not
happen (the latent cache's clip and weight digests) the caller asks for ``verify``, and the record's
field is computed from the file's bytes again on every call, the stat serving only as a pre-filter
that never alone decides that a file is unchanged. A record whose recomputed field differs is replaced
whole (its other facts, such as a probed header, are stale too) and the file is listed in
:attr:`FileRecords.rewritten`. Touching a file without changing it costs a recomputation of its
record, nothing else.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

__all__ = ["FileRecords", "default_workers", "file_stat", "sha256_file"]

logger = logging.getLogger("mm_data")

_VERSION = 1


def default_workers() -> int:
    """Processes used to probe or hash files by default: the CPUs, at most 8."""
    return max(1, min(8, os.cpu_count() or 1))


def file_stat(path: str | Path) -> tuple[int, int] | None:
    """``(size, mtime_ns)`` of a file, None when it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """SHA-256 of the file's bytes (hex), read in ``chunk``-byte pieces (hashlib: OpenSSL's SHA-NI code)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


class FileRecords:
    """Per-file records in the JSON file ``store`` (None: in memory only).

    Args:
        store: Where the records are kept, e.g. ``metadata.json.clips.json`` beside a metadata file.
    """

    def __init__(self, store: str | Path | None) -> None:
        self.store = Path(store) if store is not None else None
        self.rewritten: list[str] = []
        """Files the last :meth:`ensure` with ``verify`` found changed under an unchanged size and mtime."""

    def ensure(
        self,
        paths: Sequence[str],
        field: str,
        compute: Callable[[str], dict[str, Any]],
        *,
        workers: int | None = None,
        prune: bool = False,
        verify: bool = False,
    ) -> dict[str, dict[str, Any] | None]:
        """The records of ``paths`` with ``field`` in them, computing what is missing or stale.

        ``compute(path)`` returns the fields to record (it must contain ``field``; record an error as a
        value rather than raising). It runs in ``workers`` processes (default :func:`default_workers`;
        0 or 1: in this process). With ``prune`` the store then keeps ``paths``' records only (else it
        keeps the others too). A path that cannot be stat'ed (missing, unreadable) maps to None. With
        ``verify``, ``field`` is computed again for every file, whatever its stat says (see the module
        docstring); :attr:`rewritten` lists the files whose record it replaced for that reason.
        """
        workers = default_workers() if workers is None else workers
        self.rewritten = []
        with self._locked() as writable:
            known = self._load()
            stats = {p: file_stat(p) for p in paths}
            records: dict[str, dict[str, Any] | None] = {}
            todo = []
            for path, stat in stats.items():
                record = known.get(path)
                if stat is None:
                    records[path] = None
                elif record is not None and (record.get("size"), record.get("mtime_ns")) == stat:
                    records[path] = record
                    if field not in record or verify:
                        todo.append(path)
                else:
                    records[path] = {"size": stat[0], "mtime_ns": stat[1]}
                    todo.append(path)
            for path, fields in zip(todo, _run(compute, todo, workers)):
                if field not in fields:
                    raise KeyError(f"{compute.__name__}({path!r}) returned no {field!r}: {sorted(fields)}")
                record = records[path] or {}
                if field in record and record[field] != fields[field]:  # same size and mtime, other bytes
                    self.rewritten.append(path)
                    size, mtime_ns = stats[path]  # type: ignore[misc]
                    record = {"size": size, "mtime_ns": mtime_ns}
                records[path] = {**record, **fields}
            kept = {} if prune else {p: r for p, r in known.items() if p not in records}
            kept.update({p: r for p, r in records.items() if r is not None})
            if writable and kept != known:
                self._save(kept)
        if self.rewritten:
            logger.warning(
                "mm_data: %d file(s) changed in place with their size and mtime kept (their records are "
                "replaced): %s", len(self.rewritten), ", ".join(self.rewritten[:5]),
            )  # fmt: skip
        return records

    @contextlib.contextmanager
    def _locked(self) -> Iterator[bool]:
        """Hold the store's lock; yields whether the store can be written."""
        if self.store is None:
            yield False
            return
        try:
            self.store.parent.mkdir(parents=True, exist_ok=True)
            lock = open(f"{self.store}.lock", "a")  # noqa: SIM115 - held for the with block
        except OSError as e:
            logger.warning(
                "mm_data: cannot write %s (%s); its records are kept in memory only", self.store, e
            )
            yield False
            return
        with lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            except OSError as e:  # a file system without flock (some NFS mounts): never wrong, maybe repeated
                logger.warning(
                    "mm_data: cannot lock %s (%s); processes may compute the same records", lock.name, e
                )
            yield True

    def _load(self) -> dict[str, dict[str, Any]]:
        if self.store is None or not self.store.is_file():
            return {}
        try:
            data = json.loads(self.store.read_text())
        except (OSError, json.JSONDecodeError) as e:
            logger.warning(
                "mm_data: ignoring unreadable %s (%s); its records are computed again", self.store, e
            )
            return {}
        if not isinstance(data, dict) or data.get("version") != _VERSION:
            return {}
        return dict(data.get("records", {}))

    def _save(self, records: dict[str, dict[str, Any]]) -> None:
        assert self.store is not None
        tmp = self.store.with_name(f".{self.store.name}.tmp{os.getpid()}")
        try:
            tmp.write_text(json.dumps({"version": _VERSION, "records": records}, sort_keys=True))
            os.replace(tmp, self.store)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            logger.warning(
                "mm_data: cannot write %s (%s); its records are kept in memory only", self.store, e
            )


def _run(compute: Callable[[str], dict[str, Any]], paths: list[str], workers: int) -> list[dict[str, Any]]:
    """``compute`` over ``paths`` in order: in ``workers`` forked processes when that helps."""
    if workers <= 1 or len(paths) < 2:
        return [compute(p) for p in paths]
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=min(workers, len(paths)), mp_context=context) as pool:
        return list(pool.map(compute, paths, chunksize=max(1, len(paths) // (4 * workers))))
