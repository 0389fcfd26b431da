"""CRC-32 of every storage item a DCP save writes, recorded beside it and checked when it is read.

A DCP save writes each tensor chunk (and each non-tensor entry) as one *storage item*: a byte range
of a ``.distcp`` file, named in ``.metadata`` by (file, offset, length). :class:`ChecksummingWriter`
(a ``FileSystemWriter``) computes a CRC-32 of each item's bytes as they are written (one pass over
what the writer thread writes anyway: no read back) and its coordinator writes them all, with the
tensor each item holds, into :data:`CHECKSUMS_FILENAME` before ``.metadata``; so a checkpoint that
has ``.metadata`` (a complete one) has its digests too. Since DCP may reshard on load, what is checked is
the item as stored, whatever part of it a rank reads: :func:`verify_items` reads each item a load
asks for, computes its CRC-32 and compares, before torch unpickles it
(:class:`~mm_checkpoint.restricted_dcp.RestrictedFileSystemReader` calls it). A mismatch is a
:class:`~mm_checkpoint.errors.CheckpointIntegrityError` naming the file, the byte range and the tensor.

The digest file is JSON (untrusted like every checkpoint file: parsed, its fields checked, nothing run).
"""

from __future__ import annotations

import dataclasses
import io
import json
import mmap
import os
import threading
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemWriter, Metadata
from torch.distributed.checkpoint.filesystem import FileSystem, _StorageInfo
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from .errors import CheckpointFormatError, CheckpointIntegrityError

CHECKSUMS_FILENAME = "mm_checksums.json"
"""Inside a DCP directory: ``{"version": 1, "algorithm": "crc32", "items": [{file, offset, length,
crc32, key}, ...]}``, one entry per storage item."""
CHECKSUMS_VERSION = 1
_CHUNK = 16 << 20  # bytes read at a time when checking an item


@dataclasses.dataclass
class ItemDigest:
    """The recorded CRC-32 of one storage item and the tensor (or entry) it holds."""

    file: str
    offset: int
    length: int
    crc32: int
    key: str

    def where(self, directory: Path) -> str:
        return f"{directory / self.file} (bytes {self.offset}..{self.offset + self.length})"


@dataclasses.dataclass
class _DigestedInfo(_StorageInfo):
    """A storage item's location with its CRC-32 and key, from a writer rank to the coordinator. It never
    reaches ``.metadata``: :meth:`ChecksummingWriter.finish` puts the plain location there."""

    crc32: int = 0
    key: str = ""

    def plain(self) -> _StorageInfo:
        return _StorageInfo(self.relative_path, self.offset, self.length, self.transform_descriptors)


class _DigestingStream(io.RawIOBase):
    """A file being written whose bytes are CRC'd in passing, in segments between two ``tell()`` calls.

    DCP's writer asks ``tell()`` before and after each item, so each item's bytes end up one segment
    ``(offset, length) -> crc``; an item that does not (another torch) is read back instead."""

    def __init__(self, raw: Any) -> None:
        super().__init__()
        self.raw = raw
        self.segments: dict[tuple[int, int], int] = {}
        self._start = raw.tell()
        self._pos = self._start
        self._crc = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        written = self.raw.write(view)
        self._crc = zlib.crc32(view[:written], self._crc)
        self._pos += written
        return written

    def tell(self) -> int:
        if self._pos != self._start:
            self.segments[(self._start, self._pos - self._start)] = self._crc
        self._start, self._crc = self._pos, 0
        return self._pos

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()

    def close(self) -> None:
        if not self.closed:
            self.tell()
            super().close()  # flushes
            self.raw.close()


class _DigestingFileSystem(FileSystem):
    """DCP's local file system whose written files are :class:`_DigestingStream`s, kept by path."""

    def __init__(self) -> None:
        super().__init__()
        self.streams: dict[Path, _DigestingStream] = {}
        self._lock = threading.Lock()

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[io.IOBase]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with super().create_stream(path, mode) as raw:
            stream = _DigestingStream(raw)
            with self._lock:
                self.streams[Path(path)] = stream
            try:
                yield stream
            finally:
                stream.tell()


class ChecksummingWriter(FileSystemWriter):
    """``FileSystemWriter`` that records a CRC-32 of every storage item it writes (module docstring)."""

    def __init__(self, path: str | os.PathLike, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.fs = _DigestingFileSystem()

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        super().reset(checkpoint_id)
        self.fs.streams.clear()

    def write_data(self, plan: Any, planner: Any) -> Future[list[WriteResult]]:
        results = super().write_data(plan, planner).wait()
        digested: Future[list[WriteResult]] = Future()
        digested.set_result([self._digested(result) for result in results])
        return digested

    def _digested(self, result: WriteResult) -> WriteResult:
        info: _StorageInfo = result.storage_data
        stream = self.fs.streams.get(Path(self.path) / info.relative_path)
        crc = None if stream is None else stream.segments.get((info.offset, info.length))
        if crc is None:  # not one segment of its own (another torch's writer): read it back
            crc = _crc_of(Path(self.path) / info.relative_path, info.offset, info.length)
        key = result.index.fqn + (f"@{list(result.index.offset)}" if result.index.offset is not None else "")
        return dataclasses.replace(
            result,
            storage_data=_DigestedInfo(
                info.relative_path, info.offset, info.length, info.transform_descriptors, crc, key
            ),
        )

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        digests, plain = [], []
        for rank_results in results:
            rows = []
            for result in rank_results:
                info = result.storage_data
                if isinstance(info, _DigestedInfo):
                    digests.append(
                        ItemDigest(info.relative_path, info.offset, info.length, info.crc32, info.key)
                    )
                    result = dataclasses.replace(result, storage_data=info.plain())
                rows.append(result)
            plain.append(rows)
        write_checksums(Path(self.path), digests)  # before .metadata: a complete checkpoint has both
        super().finish(metadata, plain)


def write_checksums(directory: Path, digests: Iterable[ItemDigest]) -> Path:
    """Write the digest file of the DCP directory ``directory`` (atomically, fsynced)."""
    items = sorted((dataclasses.asdict(d) for d in digests), key=lambda d: (d["file"], d["offset"]))
    path = directory / CHECKSUMS_FILENAME
    tmp = path.with_name(f".{CHECKSUMS_FILENAME}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump({"version": CHECKSUMS_VERSION, "algorithm": "crc32", "items": items}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


_FIELDS = {"file": str, "offset": int, "length": int, "crc32": int, "key": str}


def read_checksums(directory: str | os.PathLike) -> dict[tuple[str, int], ItemDigest] | None:
    """The digests recorded in the DCP directory ``directory`` by (file, offset); None without a file.

    Raises:
        CheckpointFormatError: the file is not a digest file (bad JSON, version, fields), naming it.
    """
    path = Path(directory) / CHECKSUMS_FILENAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise CheckpointFormatError(
            f"{path} is not a readable digest file ({err}): the checkpoint is corrupt"
        ) from None
    if (
        not isinstance(data, dict)
        or data.get("version") != CHECKSUMS_VERSION
        or data.get("algorithm") != "crc32"
    ):
        raise CheckpointFormatError(f"{path}: expected version {CHECKSUMS_VERSION} crc32 digests")
    items = data.get("items")
    if not isinstance(items, list):
        raise CheckpointFormatError(f"{path}: 'items' is not a list")
    out: dict[tuple[str, int], ItemDigest] = {}
    for n, item in enumerate(items):
        if not isinstance(item, dict) or any(
            not isinstance(item.get(k), t) or isinstance(item.get(k), bool) for k, t in _FIELDS.items()
        ):
            raise CheckpointFormatError(
                f"{path}: item {n} is not {{file, offset, length, crc32, key}}: {item!r:.200}"
            )
        digest = ItemDigest(**{k: item[k] for k in _FIELDS})
        out[(digest.file, digest.offset)] = digest
    return out


@contextmanager
def _mapped(path: Path) -> Iterator[memoryview]:
    """The bytes of ``path`` as a read-only memory map (no copy out of the page cache)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            yield memoryview(b"")
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
            yield view


def _crc_in(view: memoryview, offset: int, length: int) -> int:
    """CRC-32 of ``length`` bytes of ``view`` from ``offset`` (fewer when it ends first), in chunks (the
    GIL is released during each)."""
    crc, end = 0, min(offset + length, len(view))
    for start in range(offset, end, _CHUNK):
        with view[start : min(start + _CHUNK, end)] as chunk:
            crc = zlib.crc32(chunk, crc)
    return crc


def _crc_of(path: Path, offset: int, length: int) -> int:
    """CRC-32 of ``length`` bytes of the file ``path`` from ``offset``."""
    with _mapped(path) as view:
        return _crc_in(view, offset, length)


def verify_items(
    directory: Path, items: Iterable[_StorageInfo], digests: dict[tuple[str, int], ItemDigest], done: set
) -> None:
    """Check the CRC-32 of each storage item in ``items`` (skipping those in ``done``, then added).

    Raises:
        CheckpointIntegrityError: an item's bytes do not match its digest, or it has none.
    """
    todo: dict[str, list[_StorageInfo]] = {}
    for info in items:
        if (info.relative_path, info.offset) not in done:
            todo.setdefault(info.relative_path, []).append(info)
    for name, infos in sorted(todo.items()):
        with _mapped(directory / name) as view:
            for info in sorted(infos, key=lambda i: i.offset):
                digest = digests.get((name, info.offset))
                if digest is None or digest.length != info.length:
                    raise CheckpointIntegrityError(
                        f"{directory / name} (bytes {info.offset}..{info.offset + info.length}) has no checksum in "
                        f"{directory / CHECKSUMS_FILENAME}: the digest file does not belong to this checkpoint",
                        path=directory / name,
                    )
                crc = _crc_in(view, info.offset, info.length)
                if crc != digest.crc32:
                    raise CheckpointIntegrityError(
                        f"{digest.where(directory)}: tensor {digest.key!r} fails its CRC-32 check (recorded "
                        f"{digest.crc32:08x}, read {crc:08x}): the file is corrupted",
                        path=directory / name,
                        key=digest.key,
                    )
                done.add((name, info.offset))


def verify_checkpoint_dir(directory: str | os.PathLike, metadata: Metadata) -> int:
    """Check every storage item of the DCP directory ``directory``; the number checked.

    Raises:
        CheckpointIntegrityError: a corrupted item, or no digest file.
    """
    directory = Path(directory)
    digests = read_checksums(directory)
    if digests is None:
        raise CheckpointIntegrityError(
            f"{directory} has no {CHECKSUMS_FILENAME}: nothing to check it against", path=directory
        )
    items = list(metadata.storage_data.values())
    verify_items(directory, items, digests, set())
    return len(items)


__all__ = [
    "CHECKSUMS_FILENAME",
    "ChecksummingWriter",
    "ItemDigest",
    "read_checksums",
    "verify_checkpoint_dir",
    "verify_items",
    "write_checksums",
]
