"""Reading ``torch.save`` state dicts (``.pth`` / ``.pt``), such as the official Wan2.2 release's
``Wan2.1_VAE.pth`` and ``models_t5_umt5-xxl-enc-bf16.pth``, without running anything in them.

A ``.pth`` is a zip archive holding a pickle (``data.pkl``) that names the tensors and their storages.
:class:`PthReader` opens it with ``torch.load(weights_only=True, mmap=True, map_location="cpu")``:
torch's restricted unpickler admits tensors, dtypes and plain containers only, so a crafted pickle
executes nothing and is refused (:class:`~mm_checkpoint.CheckpointFormatError` naming the file), and
the storages stay memory-mapped, so only the bytes of what is read become resident. The reader has the
interface of :class:`~mm_checkpoint.safetensors_io.SafetensorsReader` (``keys``, ``info``, ``read``
with a slice), so loading, online conversion, export of a merged LoRA and ``mm-ckpt`` treat both alike.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from .errors import CheckpointFormatError, CheckpointIntegrityError, CheckpointNotFoundError
from .restricted_dcp import ZIP_ERROR_MARK
from .safetensors_io import StoredTensor, TensorInfo
from .zip_files import zip_damage


def _not_zip(path: Path) -> str:
    """Why ``path``, which is not a zip archive, cannot be read: a legacy ``torch.save`` pickle (which a
    re-save fixes) or not a torch checkpoint at all."""
    with open(path, "rb") as f:
        head = f.read(2)
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return (
            f"{path} is a legacy (pre-zip) torch checkpoint (what torch.save wrote before torch 1.6), so it "
            "cannot be memory-mapped; re-save it once with torch.save(torch.load(path, weights_only=True), "
            "new_path)"
        )
    return (
        f"{path} is not a torch checkpoint: it is neither a zip archive (what torch.save writes) nor a legacy "
        f"torch.save pickle (it begins with {head!r})"
    )


def load_pth_state(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The flat ``{name: tensor}`` state dict in ``path``, memory-mapped, read with ``weights_only``.

    A top-level ``{"state_dict": {...}}`` wrapper (a common training-script layout) is unwrapped.

    Raises:
        CheckpointNotFoundError: no such file.
        CheckpointIntegrityError: the file is truncated or its zip structure is damaged (naming it).
        CheckpointFormatError: the pickle needs more than tensors and containers (a crafted file: nothing
            ran), the file is a legacy (pre-zip) torch checkpoint or none at all, or it holds something
            other than a flat mapping of names to tensors; each names the file.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointNotFoundError(f"checkpoint file {path} does not exist")
    damage = zip_damage(path)
    if damage is not None:
        raise CheckpointIntegrityError(f"{path}: {damage}", path=path)
    if not zipfile.is_zipfile(path):
        raise CheckpointFormatError(_not_zip(path))
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, KeyError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if ZIP_ERROR_MARK in first:  # miniz: a record the central directory names is not where it says
            raise CheckpointIntegrityError(
                f"{path}: its zip structure is corrupted ({first.split('. This is an internal miniz error')[0]}): "
                "the file is damaged; copy it again from its source",
                path=path,
            ) from None
        raise CheckpointFormatError(
            f"{path} was refused: torch.load(weights_only=True) admits tensors and plain containers only, "
            f"and this file needs more ({first}); nothing in it was run"
        ) from None
    if (
        isinstance(state, Mapping)
        and set(state) == {"state_dict"}
        and isinstance(state["state_dict"], Mapping)
    ):
        state = state["state_dict"]
    if not isinstance(state, Mapping):
        raise CheckpointFormatError(
            f"{path} holds a {type(state).__name__}, expected a state dict of tensors"
        )
    wrong = sorted(
        str(k) for k, v in state.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)
    )
    if wrong:
        raise CheckpointFormatError(
            f"{path}: a weights file maps names to tensors; these entries are not tensors: {wrong[:10]}"
        )
    return dict(state)


class PthReader:
    """Key-addressed reader over a ``.pth`` state dict (see the module docstring); a context manager.

    ``read(key, index)`` copies only ``tensor[index]`` out of the memory map (an FSDP shard reads its
    own rows). ``zero_copy=True`` returns whole tensors as views of the map instead (for streaming
    conversion).
    """

    def __init__(self, path: str | os.PathLike, *, zero_copy: bool = False) -> None:
        self.path = Path(path)
        self.zero_copy = zero_copy
        self._state = load_pth_state(self.path)

    def __enter__(self) -> PthReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Drop the tensors (the map closes when the last view of it is freed)."""
        self._state = {}

    def keys(self) -> list[str]:
        return list(self._state)

    def __contains__(self, key: str) -> bool:
        return key in self._state

    def _tensor(self, key: str) -> torch.Tensor:
        try:
            return self._state[key]
        except KeyError:
            raise KeyError(f"tensor {key!r} not found in {self.path}") from None

    def info(self, key: str) -> TensorInfo:
        """Shape and dtype of ``key`` (no data is read)."""
        t = self._tensor(key)
        return TensorInfo(tuple(t.shape), t.dtype)

    def stored(self, key: str) -> StoredTensor:
        """Dtype name, shape and bytes of ``key``."""
        t = self._tensor(key)
        return StoredTensor(str(t.dtype).replace("torch.", ""), tuple(t.shape), t.nbytes)

    def read(self, key: str, index: Sequence[slice] | None = None) -> torch.Tensor:
        """Tensor ``key`` (a copy), or only ``tensor[index]`` when ``index`` is given."""
        t = self._tensor(key)
        if index is None:
            return t if self.zero_copy else t.clone()
        return t[tuple(index)].clone()

    def digest(self) -> str:
        """SHA-256 over every tensor's name, dtype and shape: what a safetensors header's hash records
        (no tensor data is read)."""
        entries = sorted([k, str(t.dtype), list(t.shape)] for k, t in self._state.items())
        return hashlib.sha256(json.dumps(entries).encode()).hexdigest()
