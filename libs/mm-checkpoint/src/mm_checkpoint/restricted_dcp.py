"""Reading torch DCP checkpoints without running code a checkpoint file could carry.

DCP stores its ``.metadata`` as a pickle and non-tensor entries (scheduler and optimizer scalars)
as ``torch.save`` bytes, and torch reads both with full unpickling: a crafted checkpoint directory
runs arbitrary code in whoever inspects, exports or resumes it. Here:

* :class:`RestrictedFileSystemReader` (a ``FileSystemReader``) unpickles ``.metadata`` admitting only
  the DCP metadata classes, ``torch.Size``, dtypes, layouts and paths, and checks that every storage
  file it names is a plain file name inside the checkpoint directory;
* :class:`RestrictedLoadPlanner` (a ``DefaultLoadPlanner``) admits a non-tensor entry only when it
  loads with ``torch.load(weights_only=True)`` (tensors and plain Python values);
* :func:`check_dcp_storage` finds missing or truncated ``.distcp`` files before any read;
* the reader checks the CRC-32 of every storage item it reads against the digests the save recorded
  (:mod:`.checksums`), unless made with ``verify=False``.

Anything else is refused with :class:`~mm_checkpoint.errors.CheckpointFormatError` naming the file.
"""

from __future__ import annotations

import collections
import io
import logging
import os
import pickle
from pathlib import Path, PosixPath, PurePosixPath
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException, DefaultLoadPlanner, FileSystemReader, Metadata
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from .checksums import CHECKSUMS_FILENAME, ItemDigest, read_checksums, verify_items
from .errors import (
    CheckpointError,
    CheckpointFormatError,
    CheckpointIntegrityError,
    CheckpointLoadError,
    CheckpointNotFoundError,
    raised_on_every_rank,
)
from .layout import METADATA_FILENAME
from .runtime import is_distributed, single_process_quiet

logger = logging.getLogger(__name__)

ZIP_ERROR_MARK = "PytorchStreamReader failed"
"""How torch's zip reader (miniz) begins the message of a damaged zip record or archive."""

_ALLOWED: dict[tuple[str, str], Any] = {
    **{
        (dcp_metadata.__name__, cls.__name__): cls
        for cls in (
            dcp_metadata.Metadata,
            dcp_metadata.TensorStorageMetadata,
            dcp_metadata.BytesStorageMetadata,
            dcp_metadata.ChunkStorageMetadata,
            dcp_metadata.TensorProperties,
            dcp_metadata.MetadataIndex,
            dcp_metadata.StorageMeta,
            dcp_metadata._MEM_FORMAT_ENCODING,
        )
    },
    (_StorageInfo.__module__, _StorageInfo.__name__): _StorageInfo,
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
    ("pathlib", "PosixPath"): PosixPath,
    ("pathlib", "PurePosixPath"): PurePosixPath,
    ("collections", "OrderedDict"): collections.OrderedDict,
}
"""Every global a DCP ``.metadata`` pickle written by torch references (dtypes are checked apart)."""


class _MetadataUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals of :data:`_ALLOWED` and ``torch.<dtype>``."""

    def __init__(self, file: io.BufferedIOBase, path: Path) -> None:
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise CheckpointFormatError(
            f"{self.path}: refusing to unpickle {module}.{name}; DCP metadata holds only DCP metadata "
            "classes, torch.Size, dtypes and paths (a crafted or foreign file?)"
        )


def load_metadata_file(path: str | os.PathLike) -> Metadata:
    """Unpickle the DCP metadata file ``path`` with the restricted unpickler and check its structure.

    Raises:
        CheckpointFormatError: a global outside the DCP metadata classes, unreadable or truncated
            content, or a storage entry pointing outside the checkpoint directory; names ``path``.
        CheckpointNotFoundError: the file does not exist.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointNotFoundError(f"{path} does not exist: not a complete DCP checkpoint")
    with open(path, "rb") as f:
        try:
            metadata = _MetadataUnpickler(f, path).load()
        except CheckpointFormatError:
            raise
        except Exception as exc:  # any parse failure of untrusted bytes means a corrupt file
            raise CheckpointFormatError(
                f"{path} is not readable DCP metadata ({type(exc).__name__}: {exc})"
            ) from None
    _check_structure(metadata, path)
    return metadata


def _check_structure(metadata: Any, path: Path) -> None:
    if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
        raise CheckpointFormatError(f"{path} holds a {type(metadata).__name__}, not DCP Metadata")
    storage = metadata.storage_data
    if not isinstance(storage, dict):
        raise CheckpointFormatError(f"{path}: storage_data is a {type(storage).__name__}, expected a dict")
    for index, info in storage.items():
        name = getattr(info, "relative_path", None)
        if not isinstance(info, _StorageInfo) or not _plain_file_name(name):
            raise CheckpointFormatError(
                f"{path}: entry {getattr(index, 'fqn', index)!r} points at {name!r}; "
                "expected a file name inside the checkpoint directory"
            )


def _plain_file_name(name: object) -> bool:
    return (
        isinstance(name, str) and name not in ("", ".", "..") and Path(name).name == name and "\\" not in name
    )


def check_dcp_storage(path: str | os.PathLike, metadata: Metadata) -> None:
    """Raise :class:`CheckpointFormatError` listing every storage file of ``metadata`` that is missing
    from the DCP directory ``path`` or shorter than the bytes the metadata places in it."""
    path = Path(path)
    needed: dict[str, int] = {}
    for info in metadata.storage_data.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    problems = []
    for name, size in sorted(needed.items()):
        file = path / name
        if not file.is_file():
            problems.append(f"{name} is missing")
        elif file.stat().st_size < size:
            problems.append(f"{name} is truncated ({file.stat().st_size} bytes, the metadata needs {size})")
    if problems:
        raise CheckpointFormatError(f"DCP checkpoint {path}: " + "; ".join(problems))


class RestrictedFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose ``read_metadata`` runs no code from the file (see the module doc).

    ``verify`` (default): check each storage item it reads against the checkpoint's CRC-32 digests
    (:data:`~mm_checkpoint.checksums.CHECKSUMS_FILENAME`) before torch reads it, and refuse a checkpoint
    that ``required_checksums`` says has them (its ``mm_checkpoint.json`` does) when the file is gone. A
    DCP directory written without digests (an older save, another tool) is read unchecked, logged once.
    """

    def __init__(
        self, path: str | os.PathLike, *, verify: bool = True, required_checksums: bool = False
    ) -> None:
        super().__init__(path)
        self.verify = verify
        self.required_checksums = required_checksums
        self._digests: dict[tuple[str, int], ItemDigest] | None = None
        self._verified: set[tuple[str, int]] = set()
        self._looked = False

    def _checksums(self) -> dict[tuple[str, int], ItemDigest] | None:
        if not self._looked:
            directory = Path(self.path)
            self._digests = read_checksums(directory)
            self._looked = True
            if self._digests is None:
                if self.required_checksums:
                    raise CheckpointIntegrityError(
                        f"{directory} has no {CHECKSUMS_FILENAME}, which its save wrote: the checkpoint was "
                        "damaged after it was saved",
                        path=directory / CHECKSUMS_FILENAME,
                    )
                logger.warning("%s has no %s (written before checksums, or by another tool): read unchecked",
                               directory, CHECKSUMS_FILENAME)  # fmt: skip
        return self._digests

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        if self.verify and plan.items and (digests := self._checksums()) is not None:
            items = [self.storage_data[item.storage_index] for item in plan.items]
            verify_items(Path(self.path), items, digests, self._verified)
        return super().read_data(plan, planner)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        metadata = load_metadata_file(self._get_metadata_path(rank))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class RestrictedLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` that admits a non-tensor entry only if ``torch.load(weights_only=True)``
    reads it; the admitted bytes then go through the default path unchanged."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            torch.load(value, weights_only=True)
        except Exception as exc:  # noqa: BLE001 - whatever the restricted load refuses is refused here
            raise CheckpointFormatError(
                f"DCP entry {read_item.dest_index.fqn!r} is not plain data (tensors, numbers, strings, "
                f"lists, dicts); refusing to unpickle it: {exc}"
            ) from None
        value.seek(0)
        super().load_bytes(read_item, value)


def read_dcp_metadata(path: str | os.PathLike) -> Metadata:
    """The restricted-unpickled metadata of the DCP directory ``path``, its storage files checked."""
    metadata = load_metadata_file(Path(path) / METADATA_FILENAME)
    check_dcp_storage(path, metadata)
    return metadata


def restricted_dcp_load(
    state: dict[str, Any],
    path: str | os.PathLike,
    *,
    reader: FileSystemReader | None = None,
    allow_partial_load: bool = False,
    no_dist: bool = False,
    verify: bool = True,
) -> None:
    """``torch.distributed.checkpoint.load`` of ``state`` (filled in place) from ``path`` through the
    restricted reader and planner (collective unless ``no_dist``), each storage item read checked
    against its CRC-32 unless ``verify=False`` (a ``reader`` given brings its own setting). A refusal on
    any rank raises its :class:`~mm_checkpoint.errors.CheckpointError` itself, a damaged zip record a
    :class:`~mm_checkpoint.errors.CheckpointIntegrityError`, any other failure a
    :class:`~mm_checkpoint.errors.CheckpointLoadError` naming ``path``, instead of DCP's
    ``CheckpointException`` (a ``BaseException`` that ordinary handlers miss)."""
    reader = reader or RestrictedFileSystemReader(str(path), verify=verify)
    if not isinstance(reader, RestrictedFileSystemReader):
        raise TypeError(f"reader must be a RestrictedFileSystemReader, got {type(reader).__name__}")
    planner = RestrictedLoadPlanner(allow_partial_load=allow_partial_load)
    try:
        with single_process_quiet():
            dcp.load(state, storage_reader=reader, planner=planner, no_dist=no_dist)
    except CheckpointException as exc:
        # a collective read gathers every rank's failures and raises them on every rank
        mark = raised_on_every_rank if not no_dist and is_distributed() else (lambda e: e)
        failures = {rank: e for rank, (e, _) in exc.failures.items()}
        ours = [e for e in failures.values() if isinstance(e, CheckpointError)]
        if ours:
            raise mark(ours[0]) from None
        rank, first = next(iter(failures.items()))
        what = (str(first).strip().splitlines() or [""])[0]  # torch's own messages run over many lines
        if ZIP_ERROR_MARK in what:  # torch's miniz reader: a storage item is no longer a whole zip record
            checked = (
                "its checksums were not checked"
                if not getattr(reader, "verify", True)
                else "it has no checksums"
            )
            raise mark(
                CheckpointIntegrityError(
                    f"DCP checkpoint {path}: a storage item in its .distcp files has a corrupted zip structure "
                    f"(rank {rank}: {what.split('. This is an internal miniz error')[0]}); the file is damaged "
                    f"({checked})",
                    path=Path(path),
                )
            ) from None
        raise mark(
            CheckpointLoadError(
                f"reading DCP checkpoint {path} failed on rank(s) {sorted(failures)}; rank {rank}: "
                f"{type(first).__name__}: {what}"
            )
        ) from exc
