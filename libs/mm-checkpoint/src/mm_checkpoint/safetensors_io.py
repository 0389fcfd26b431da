"""Lazy reading of safetensors checkpoints (single file or sharded + index json) and streaming writes.

Reading parses the (tiny, documented) safetensors header and ``pread``s exactly the bytes of one
tensor or one dim-0 slice of it, so nothing else of the file becomes resident. Writing streams tensor by tensor: the header
is computed from shapes first, then each tensor is produced, written and dropped.
"""

from __future__ import annotations

import ctypes
import json
import math
import mmap
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import CheckpointFormatError, CheckpointNotFoundError

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E8M0": torch.float8_e8m0fnu,
    "U16": torch.uint16,
    "U32": torch.uint32,
    "U64": torch.uint64,
    "C64": torch.complex64,
}
"""Safetensors dtypes that torch holds one element per element (read, converted and written)."""

PACKED_DTYPE_BITS: dict[str, int] = {"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}
"""Sub-byte safetensors dtypes (bits per element). Torch has no element type for them (its
``float4_e2m1fn_x2`` packs two per byte under another shape), so they are listed and counted by
their bytes (``inspect``) but not read."""
_DTYPE_NAMES = {v: k for k, v in SAFETENSORS_DTYPES.items()}


def parse_size(size: int | str) -> int:
    """Bytes in ``size``: an int, or a string such as ``"5GB"``, ``"500MB"``, ``"2GiB"``."""
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?)(i?)B?\s*", str(size), flags=re.IGNORECASE)
    if not m:
        raise ValueError(f"cannot parse size {size!r}; expected e.g. 5GB, 500MB or an integer")
    base = 1024 if m.group(3) else 1000
    return int(float(m.group(1)) * base ** " KMGT".index(m.group(2).upper() or " "))


def weight_files(path: str | os.PathLike) -> list[Path]:
    """The safetensors files making up the checkpoint at ``path`` (a file, or a dir with/without index json)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise CheckpointNotFoundError(f"checkpoint path {path} does not exist")
    indexes = sorted(path.glob("*.safetensors.index.json"))
    if len(indexes) > 1:
        raise CheckpointFormatError(
            f"{path} holds several index files {[p.name for p in indexes]}; expected one"
        )
    if indexes:
        names = _index_shards(indexes[0])
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            raise CheckpointNotFoundError(f"{indexes[0]} lists shard(s) missing from {path}: {missing}")
        return [path / n for n in names]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointNotFoundError(f"{path} holds no .safetensors files")
    return files


def _index_shards(index: Path) -> list[str]:
    """The shard file names an ``*.safetensors.index.json`` maps tensors to (plain names in its directory)."""
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
    except (ValueError, AttributeError):
        weight_map = None
    names = sorted(set(weight_map.values())) if isinstance(weight_map, dict) else None
    if not names or not all(isinstance(n, str) and n and Path(n).name == n for n in names):
        raise CheckpointFormatError(
            f"{index} is not a valid safetensors index: expected JSON with a 'weight_map' of tensor "
            "name -> shard file name in the same directory"
        )
    return names


@dataclass(frozen=True)
class TensorInfo:
    """Shape and dtype of one stored tensor."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _element_size(self.dtype)


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class StoredTensor:
    """What a safetensors header says of one tensor, whatever its dtype: name, shape, bytes."""

    dtype: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class _Entry:
    file: Path
    stored: StoredTensor
    info: TensorInfo | None  # None: a dtype torch cannot hold (PACKED_DTYPE_BITS)
    begin: int  # absolute byte offset of the tensor data in the file


def _stored_nbytes(dtype: str, shape: tuple[int, ...]) -> int | None:
    if dtype in SAFETENSORS_DTYPES:
        return math.prod(shape) * _element_size(SAFETENSORS_DTYPES[dtype])
    if dtype in PACKED_DTYPE_BITS:
        return math.ceil(math.prod(shape) * PACKED_DTYPE_BITS[dtype] / 8)
    return None


MAX_HEADER_BYTES = 100_000_000
"""The official reader's limit on a header's length (``MAX_HEADER_SIZE`` of the safetensors crate)."""


def read_header_bytes(file: str | os.PathLike) -> bytes:
    """The raw JSON header of the safetensors file ``file`` (names, dtypes, shapes, offsets; no data).

    Raises:
        CheckpointFormatError: the length prefix is missing, over :data:`MAX_HEADER_BYTES`, or longer
            than the file, naming the file.
    """
    with open(file, "rb") as f:
        raw_len = f.read(8)
        n = int.from_bytes(raw_len, "little") if len(raw_len) == 8 else -1
        raw = f.read(n) if 0 < n <= MAX_HEADER_BYTES else b""
    if not raw or len(raw) != n:
        why = (
            f"its header length {n} exceeds {MAX_HEADER_BYTES} bytes"
            if n > MAX_HEADER_BYTES
            else ("shorter than its header length" if n > 0 else "no header length")
        )
        raise CheckpointFormatError(f"{file} is not a valid safetensors file (bad header: {why})")
    return raw


def _header_json(file: Path, raw: bytes) -> dict:
    """The header object, with the official reader's rules: a UTF-8 JSON object."""
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        header = None
    if not isinstance(header, dict):
        raise CheckpointFormatError(
            f"{file} is not a valid safetensors file (bad header: not a UTF-8 JSON object)"
        )
    meta = header.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise CheckpointFormatError(f"{file}: header __metadata__ must map strings to strings, got {meta!r}")
    return header


def _is_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry_fields(file: Path, key: str, meta: object) -> tuple[str, tuple[int, ...], int, int]:
    """``(dtype, shape, begin, end)`` of one header entry, every field of the type the format defines
    (dtype a string, shape and offsets non-negative integers)."""
    ok = isinstance(meta, dict) and isinstance(meta.get("dtype"), str)
    shape, offsets = (meta.get("shape"), meta.get("data_offsets")) if isinstance(meta, dict) else (None, None)
    ok = ok and isinstance(shape, list) and all(map(_is_size, shape))
    ok = ok and isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_size, offsets))
    if not ok:
        raise CheckpointFormatError(
            f"{file}: header entry {key!r} is malformed: {meta!r} (expected dtype: a string, shape: a list "
            "of non-negative integers, data_offsets: [begin, end], non-negative integers)"
        )
    return meta["dtype"], tuple(shape), offsets[0], offsets[1]


def _check_contiguous(file: Path, spans: list[tuple[int, int, str]]) -> int:
    """The official reader's layout rule: sorted by offset, the tensors tile the data buffer from 0
    without gaps or overlaps (so no tensor reads the header's or another tensor's bytes). Returns the
    buffer's length."""
    start = 0
    for begin, end, key in sorted(spans):
        if begin != start or end < begin:
            what = (
                "overlaps the tensor before it"
                if begin < start
                else ("leaves a gap before it" if begin > start else "ends before it begins")
            )
            raise CheckpointFormatError(
                f"{file}: tensor {key!r} has data offsets [{begin}, {end}], which {what} (expected it to "
                f"begin at {start}: the tensors must tile the data buffer in offset order)"
            )
        start = end
    return start


def _read_header(file: Path) -> dict[str, _Entry]:
    raw = read_header_bytes(file)
    n = len(raw)
    entries = {}
    spans = []
    for key, meta in _header_json(file, raw).items():
        if key == "__metadata__":
            continue
        dtype, shape, begin, end = _entry_fields(file, key, meta)
        if dtype in PACKED_DTYPE_BITS and math.prod(shape) * PACKED_DTYPE_BITS[dtype] % 8:
            raise CheckpointFormatError(
                f"{file}: tensor {key!r} ({dtype}, shape {list(shape)}) is not whole bytes"
            )
        nbytes = _stored_nbytes(dtype, shape)
        if nbytes is None:
            known = sorted([*SAFETENSORS_DTYPES, *PACKED_DTYPE_BITS])
            raise CheckpointFormatError(f"{file}: tensor {key!r} has unknown dtype {dtype}; known: {known}")
        if end - begin != nbytes:
            raise CheckpointFormatError(
                f"{file}: tensor {key!r} ({dtype}, shape {list(shape)}) needs {nbytes} bytes, its data "
                f"offsets span {end - begin}"
            )
        torch_dtype = SAFETENSORS_DTYPES.get(dtype)
        info = TensorInfo(shape, torch_dtype) if torch_dtype is not None else None
        entries[key] = _Entry(file, StoredTensor(dtype, shape, nbytes), info, 8 + n + begin)
        spans.append((begin, end, key))
    size, expected = file.stat().st_size, 8 + n + _check_contiguous(file, spans)
    if size != expected:
        what = "truncated" if size < expected else "longer than its header says"
        raise CheckpointFormatError(f"{file} is {what}: {size} bytes, its header describes {expected}")
    return entries


def _pread_into(fd: int, out: torch.Tensor, offset: int) -> None:
    view = memoryview((ctypes.c_ubyte * out.nbytes).from_address(out.data_ptr())).cast("B")
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:
            raise CheckpointFormatError(
                f"unexpected end of file reading {out.nbytes} bytes at offset {offset}"
            )
        done += got


class SafetensorsReader:
    """Key-addressed reader over a safetensors checkpoint; use as a context manager.

    Reads use ``pread`` into freshly allocated tensors, never a memory map, so only what was asked for
    becomes resident. A slice along dim 0 (an FSDP ``Shard(0)`` shard) reads just its bytes; other
    slices read the covering rows and then narrow. With ``zero_copy=True`` whole-tensor reads return
    copy-on-write views of a memory map instead (fastest for streaming conversion; the pages stay
    mapped until :meth:`close`).
    """

    def __init__(self, path: str | os.PathLike, *, zero_copy: bool = False) -> None:
        self.path = Path(path)
        self.zero_copy = zero_copy
        self._maps: dict[Path, mmap.mmap] = {}
        self._entries: dict[str, _Entry] = {}
        for file in weight_files(path):
            for key, entry in _read_header(file).items():
                if key in self._entries:
                    raise CheckpointFormatError(
                        f"key {key!r} appears in both {self._entries[key].file} and {file}"
                    )
                self._entries[key] = entry
        self._fds: dict[Path, int] = {}

    def __enter__(self) -> SafetensorsReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the open files."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}
        self._maps = {}  # mappings close when the last tensor viewing them is freed

    def keys(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def info(self, key: str) -> TensorInfo:
        """Shape and torch dtype of ``key`` without reading it.

        Raises:
            CheckpointFormatError: a dtype torch cannot hold (:data:`PACKED_DTYPE_BITS`), naming it.
        """
        return self._torch_info(self._entry(key), key)

    def stored(self, key: str) -> StoredTensor:
        """Dtype name, shape and bytes of ``key`` as its header states them (any safetensors dtype)."""
        return self._entry(key).stored

    def _torch_info(self, entry: _Entry, key: str) -> TensorInfo:
        if entry.info is None:
            raise CheckpointFormatError(
                f"{entry.file}: tensor {key!r} is {entry.stored.dtype}, which torch has no element type for; "
                "`mm-ckpt inspect` lists it, but it cannot be loaded, converted or verified"
            )
        return entry.info

    def read(self, key: str, index: Sequence[slice] | None = None) -> torch.Tensor:
        """Tensor ``key``, or only ``tensor[index]`` (slices with unit step) when ``index`` is given."""
        entry = self._entry(key)
        info = self._torch_info(entry, key)
        shape = info.shape
        if index is None and self.zero_copy:
            return self._mapped(entry, info)
        full = [slice(0, d) for d in shape]
        index = list(index or ()) + full[len(index or ()) :]
        if not shape:
            rows, start = (), 0
        else:
            start, stop = index[0].start or 0, shape[0] if index[0].stop is None else index[0].stop
            rows = (stop - start, *shape[1:])
        out = torch.empty(rows, dtype=info.dtype)
        if out.numel():
            row_bytes = math.prod(shape[1:]) * out.element_size() if shape else 0
            _pread_into(self._fd(entry.file), out, entry.begin + start * row_bytes)
        rest = index[1:]
        if any((s.start or 0, s.stop) != (0, d) for s, d in zip(rest, shape[1:])):
            out = out[(slice(None), *rest)].contiguous()
        return out

    def _entry(self, key: str) -> _Entry:
        try:
            return self._entries[key]
        except KeyError:
            raise KeyError(f"tensor {key!r} not found in safetensors checkpoint {self.path}") from None

    def _mapped(self, entry: _Entry, info: TensorInfo) -> torch.Tensor:
        count = math.prod(info.shape)
        if count == 0:
            return torch.empty(info.shape, dtype=info.dtype)
        if entry.file not in self._maps:
            self._maps[entry.file] = mmap.mmap(self._fd(entry.file), 0, access=mmap.ACCESS_COPY)
        flat = torch.frombuffer(self._maps[entry.file], dtype=info.dtype, count=count, offset=entry.begin)
        return flat.reshape(info.shape)

    def _fd(self, file: Path) -> int:
        if file not in self._fds:
            self._fds[file] = os.open(file, os.O_RDONLY)
        return self._fds[file]


# --------------------------------------------------------------------------- streaming writer

TensorProducer = Callable[[], torch.Tensor]


@dataclass(frozen=True)
class PendingTensor:
    """A tensor to write: its name, layout and a callable that produces it when its turn comes."""

    key: str
    info: TensorInfo
    produce: TensorProducer


def plan_shards(tensors: Sequence[PendingTensor], max_shard_size: int) -> list[list[PendingTensor]]:
    """Greedy split (in order) into shards of at most ``max_shard_size`` bytes (a bigger tensor gets its own)."""
    shards: list[list[PendingTensor]] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t.info.nbytes > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.info.nbytes
    return shards


def _header(tensors: Sequence[PendingTensor], metadata: Mapping[str, str] | None = None) -> bytes:
    header: dict[str, object] = {"__metadata__": {"format": "pt", **(metadata or {})}}
    offset = 0
    for t in tensors:
        end = offset + t.info.nbytes
        header[t.key] = {
            "dtype": _DTYPE_NAMES[t.info.dtype],
            "shape": list(t.info.shape),
            "data_offsets": [offset, end],
        }
        offset = end
    raw = json.dumps(header, separators=(",", ":")).encode()
    # Pad (with spaces, as the format allows) so tensor data starts 64-byte aligned: zero-copy readers
    # then see the same alignment as freshly allocated tensors (SIMD kernels can round differently).
    return raw + b" " * (-(len(raw) + 8) % 64)


def _tensor_bytes(tensor: torch.Tensor) -> memoryview:
    tensor = tensor.detach().cpu().contiguous()
    if tensor.nbytes == 0:
        return memoryview(b"")
    buf = (ctypes.c_ubyte * tensor.nbytes).from_address(tensor.data_ptr())
    return memoryview(buf).cast("B")


def write_safetensors_file(
    path: str | os.PathLike, tensors: Sequence[PendingTensor], metadata: Mapping[str, str] | None = None
) -> Iterator[str]:
    """Write ``tensors`` to one safetensors file, producing each only when written; yields keys as written.
    The file appears whole (written beside it as ``<path>.tmp``, renamed), or not at all.
    ``metadata`` (string to string) goes into the header's ``__metadata__`` beside ``format: pt``."""
    if any(not isinstance(k, str) or not isinstance(v, str) for k, v in (metadata or {}).items()):
        raise CheckpointFormatError(f"{path}: safetensors metadata maps strings to strings")
    header = _header(tensors, metadata)
    tmp = Path(f"{path}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(len(header).to_bytes(8, "little"))
            f.write(header)
            for t in tensors:
                tensor = t.produce()
                if tuple(tensor.shape) != t.info.shape or tensor.dtype != t.info.dtype:
                    raise CheckpointFormatError(
                        f"tensor {t.key!r} came out as {tuple(tensor.shape)} {tensor.dtype}, "
                        f"planned {t.info.shape} {t.info.dtype}"
                    )
                f.write(_tensor_bytes(tensor))
                del tensor
                yield t.key
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:  # a failed (or abandoned) write leaves no partial file
        tmp.unlink(missing_ok=True)


def save_safetensors(
    tensors: Mapping[str, torch.Tensor], path: str | os.PathLike, metadata: Mapping[str, str] | None = None
) -> Path:
    """Write ``tensors`` (and string ``metadata``) to the single safetensors file ``path`` (torch alone,
    no numpy), atomically."""
    pending = [
        PendingTensor(key, TensorInfo(tuple(t.shape), t.dtype), lambda t=t: t) for key, t in tensors.items()
    ]
    for _ in write_safetensors_file(path, pending, metadata):
        pass
    return Path(path)


def shard_filenames(prefix: str, count: int) -> list[str]:
    """``prefix.safetensors`` for one shard, else ``prefix-00001-of-0000N.safetensors``."""
    if count == 1:
        return [f"{prefix}.safetensors"]
    return [f"{prefix}-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def write_index(out_dir: Path, prefix: str, shards: list[list[PendingTensor]], names: list[str]) -> Path:
    """Write ``prefix.safetensors.index.json`` (total size + weight map) for a sharded checkpoint."""
    weight_map = {t.key: name for shard, name in zip(shards, names) for t in shard}
    total = sum(t.info.nbytes for shard in shards for t in shard)
    index = out_dir / f"{prefix}.safetensors.index.json"
    index.write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n"
    )
    return index
