"""Shard files of the latent cache: many samples in one safetensors file, read by sample key.

A shard holds each sample's tensors under ``<key>/<name>`` and, in the safetensors metadata header, one
entry ``mm_data.shard``: canonical JSON ``{"version": 1, "samples": {key: {"meta": {...}, "crc32":
{name: crc}}}}`` (the sample's non-tensor values and a CRC-32 of each tensor's bytes). One metadata
entry, keys sorted, because safetensors writes a multi-entry header in hash-map order, which would make
two writes of the same shard differ byte for byte.

Reading: :class:`ShardReader` keeps shards open per process (a safetensors handle is a memory map of the
file and holds no file descriptor; a DataLoader worker reopens its own after a fork), up to ``max_open``
(4096 by default, well under Linux's 65530 maps per process), so each reading process opens each shard
once instead of one file per sample. Keep a cache's shard count under ``max_open`` (``shard_size`` about
samples / 4096 or more) and a training step opens no file once every shard has been reached. A file that is truncated, has an
unreadable header, lacks a sample or whose bytes fail the CRC raises :class:`CorruptShardError` naming
the file and the samples it held.

Verifying (:func:`verify_shard`, what a preprocess run does to every shard before it trusts one): the
file's safetensors header is parsed by hand and each tensor's stored bytes are CRC-checked against the
shard header, without torch (a tensor's CRC is that of its bytes as stored, so the two agree); zlib
releases the GIL, so threads verify shards in parallel.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .cache_keys import canonical_json

__all__ = [
    "CorruptShardError",
    "SHARD_HEADER_KEY",
    "ShardReader",
    "read_shard_header",
    "tensor_crc32",
    "verify_shard",
    "write_sample_file",
    "write_shard",
]

SHARD_HEADER_KEY = "mm_data.shard"
"""The one safetensors metadata entry of a shard (canonical JSON of its samples' values and CRCs)."""
_VERSION = 1

Sample = tuple[str, Mapping[str, torch.Tensor], Mapping[str, Any]]
"""``(key, tensors, meta)`` of one cached sample."""


class CorruptShardError(RuntimeError):
    """A shard file cannot be read as written; names the file, why, and the samples it held."""

    def __init__(self, path: str | Path, reason: str, samples: Sequence[Any] = ()) -> None:
        self.path, self.reason, self.samples = str(path), reason, list(samples)
        held = f"; it held samples {self.samples}" if self.samples else ""
        super().__init__(
            f"{self.path}: corrupt cache shard ({reason}){held}. Run the preprocess again: it verifies "
            "every shard and recomputes exactly the samples a damaged one held"
        )


def tensor_crc32(tensor: torch.Tensor) -> int:
    """CRC-32 of a CPU tensor's bytes (zlib's; any dtype, as stored)."""
    data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return zlib.crc32(data)


def _tensors(tensors: Mapping[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in tensors.items():
        if "/" in name:
            raise ValueError(f"{where}: tensor name {name!r} must not contain '/'")
        out[name] = tensor.detach().to("cpu").contiguous()
    return out


def _atomic_save(path: Path, tensors: dict[str, torch.Tensor], header: dict[str, Any]) -> int:
    """Write a safetensors file through a temporary file and a rename; return its size in bytes."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        save_file(tensors, str(tmp), metadata={SHARD_HEADER_KEY: canonical_json(header)})
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path.stat().st_size


def write_shard(path: str | Path, samples: Sequence[Sample]) -> int:
    """Write ``samples`` as one shard at ``path`` (atomically); return the file's size in bytes."""
    path = Path(path)
    tensors: dict[str, torch.Tensor] = {}
    entries: dict[str, Any] = {}
    for key, sample_tensors, meta in samples:
        own = _tensors(sample_tensors, f"sample {key}")
        tensors.update({f"{key}/{name}": t for name, t in own.items()})
        entries[key] = {"meta": dict(meta), "crc32": {name: tensor_crc32(t) for name, t in own.items()}}
    return _atomic_save(path, tensors, {"version": _VERSION, "samples": entries})


def write_sample_file(
    path: str | Path, key: str, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]
) -> int:
    """One sample as a one-sample shard (the preprocess's staging files); size in bytes."""
    return write_shard(path, [(key, tensors, meta)])


def read_shard_header(path: str | Path, samples: Sequence[Any] = ()) -> dict[str, Any]:
    """The ``samples`` entry of a shard's header (key -> meta and CRCs), without reading tensor data.

    Raises:
        CorruptShardError: the file is missing, truncated or its header is not a shard's (``samples``:
            what the caller knows the shard held, for the message).
    """
    try:
        with safe_open(str(path), framework="pt") as f:
            return _header(f, path, samples)
    except (SafetensorError, OSError, ValueError) as e:
        raise CorruptShardError(path, f"unreadable: {e}", samples) from e


def _header(handle: Any, path: str | Path, samples: Sequence[Any]) -> dict[str, Any]:
    raw = (handle.metadata() or {}).get(SHARD_HEADER_KEY)
    if raw is None:
        raise CorruptShardError(path, f"no {SHARD_HEADER_KEY!r} header entry", samples)
    try:
        header = json.loads(raw)
    except json.JSONDecodeError as e:
        raise CorruptShardError(path, f"header entry is not JSON: {e}", samples) from e
    if header.get("version") != _VERSION or not isinstance(header.get("samples"), dict):
        raise CorruptShardError(path, f"unknown shard version {header.get('version')!r}", samples)
    return header["samples"]


_MAX_HEADER = 1 << 30
"""Largest safetensors header a shard may declare (a larger one means damaged length bytes)."""
_CHUNK = 1 << 24


def _stored_header(handle: Any) -> tuple[dict[str, Any], dict[str, Any], int]:
    """``(tensor entries, shard samples, first data byte)`` of an open shard file, read without torch."""
    head = handle.read(8)
    if len(head) < 8:
        raise ValueError("shorter than a safetensors header")
    (length,) = struct.unpack("<Q", head)
    if length > _MAX_HEADER:
        raise ValueError(f"header length {length} is not plausible")
    raw = handle.read(length)
    if len(raw) < length:
        raise ValueError("truncated in its header")
    entries = json.loads(raw)
    meta = entries.pop("__metadata__", None) or {}
    if SHARD_HEADER_KEY not in meta:
        raise ValueError(f"no {SHARD_HEADER_KEY!r} header entry")
    samples = json.loads(meta[SHARD_HEADER_KEY])
    if samples.get("version") != _VERSION or not isinstance(samples.get("samples"), dict):
        raise ValueError(f"unknown shard version {samples.get('version')!r}")
    return entries, samples["samples"], 8 + length


def _crc_of(handle: Any, begin: int, end: int) -> int:
    handle.seek(begin)
    crc, left = 0, end - begin
    while left > 0:
        block = handle.read(min(_CHUNK, left))
        if not block:
            raise ValueError(f"truncated: bytes {begin}-{end} are not all there")
        crc, left = zlib.crc32(block, crc), left - len(block)
    return crc


def verify_shard(path: str | Path, expected_bytes: int | None = None) -> str | None:
    """Why the shard (or staged sample) file ``path`` cannot be trusted, or None when every tensor the
    shard header lists is there and its stored bytes match the CRC-32 recorded for it.

    Reads the whole file once (sequentially; no torch). ``expected_bytes``: the size the cache index
    recorded, checked first.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        if expected_bytes is not None and size != expected_bytes:
            return f"{size} bytes, the cache index says {expected_bytes}"
        with open(path, "rb") as handle:
            entries, samples, start = _stored_header(handle)
            spans = []
            for key, entry in samples.items():
                for name, crc in entry["crc32"].items():
                    tensor = entries.get(f"{key}/{name}")
                    if tensor is None:
                        return f"tensor {key}/{name} is not in it"
                    begin, end = tensor["data_offsets"]
                    spans.append((start + int(begin), start + int(end), f"{key}/{name}", int(crc)))
            if max((end for _, end, _, _ in spans), default=start) > size:
                return f"truncated: {size} bytes"
            for begin, end, name, crc in sorted(spans):
                if _crc_of(handle, begin, end) != crc:
                    return f"tensor {name} fails its CRC-32"
    except FileNotFoundError:
        return "the file is missing"
    except (OSError, ValueError, KeyError, TypeError) as e:  # JSONDecodeError is a ValueError
        return f"unreadable: {e}"
    return None


class _OpenShard:
    """One open shard: its safetensors handle and header."""

    def __init__(self, path: Path, expected_bytes: int | None, samples: Sequence[Any]) -> None:
        self.path, self.samples = path, samples
        size = path.stat().st_size if path.exists() else None
        if size is None:
            raise CorruptShardError(path, "the file is missing", samples)
        if expected_bytes is not None and size != expected_bytes:
            raise CorruptShardError(path, f"{size} bytes, the cache index says {expected_bytes}", samples)
        try:
            self.handle = safe_open(str(path), framework="pt")
            self.entries = _header(self.handle, path, samples)
        except (SafetensorError, OSError, ValueError) as e:
            raise CorruptShardError(path, f"unreadable: {e}", samples) from e

    def sample(self, key: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        entry = self.entries.get(key)
        if entry is None:
            raise CorruptShardError(self.path, f"sample {key} is not in it", self.samples)
        tensors = {}
        for name, crc in entry["crc32"].items():
            try:
                tensor = self.handle.get_tensor(f"{key}/{name}")
            except (SafetensorError, OSError, ValueError) as e:
                raise CorruptShardError(self.path, f"tensor {key}/{name}: {e}", self.samples) from e
            if tensor_crc32(tensor) != crc:
                raise CorruptShardError(self.path, f"tensor {key}/{name} fails its CRC-32", self.samples)
            tensors[name] = tensor
        return tensors, dict(entry["meta"])


class ShardReader:
    """Reads samples by shard path and key, keeping up to ``max_open`` shards open in this process.

    Args:
        max_open: Shards kept open (memory maps; least recently used closed first).
        describe: ``describe(path) -> samples`` names what a shard held, for a corrupt shard's message.
        expected_bytes: ``expected_bytes(path) -> size`` (or None) as the cache index recorded it.
    """

    def __init__(
        self,
        max_open: int = 4096,
        describe: Callable[[Path], Sequence[Any]] | None = None,
        expected_bytes: Callable[[Path], int | None] | None = None,
    ) -> None:
        self.max_open = max(1, max_open)
        self.describe, self.expected_bytes = describe, expected_bytes
        self.opened = 0  # files this process opened (a benchmark counts them per training step)
        self._pid = os.getpid()
        self._open: OrderedDict[Path, _OpenShard] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_open"] = OrderedDict()  # handles do not travel to spawned workers; they reopen
        return state

    def read(self, path: str | Path, key: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """``(tensors, meta)`` of sample ``key`` in the shard at ``path``."""
        return self._shard(Path(path)).sample(key)

    def _shard(self, path: Path) -> _OpenShard:
        if os.getpid() != self._pid:  # a forked DataLoader worker: its own handles
            self._pid, self._open = os.getpid(), OrderedDict()
        shard = self._open.get(path)
        if shard is None:
            samples = self.describe(path) if self.describe else ()
            expected = self.expected_bytes(path) if self.expected_bytes else None
            shard = self._open[path] = _OpenShard(path, expected, samples)
            self.opened += 1
            while len(self._open) > self.max_open:
                self._open.popitem(last=False)
        self._open.move_to_end(path)
        return shard
