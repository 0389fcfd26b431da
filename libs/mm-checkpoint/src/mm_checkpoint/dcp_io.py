"""torch.distributed.checkpoint (DCP) reading and writing helpers.

* :class:`DcpReader` - key-addressed, single-process reads of one tensor at a time;
* :func:`save_lazy_dcp` - write a DCP directory whose tensors are produced one at a time
  (so converting a checkpoint never holds it all in memory);
* :func:`load_dcp_into` - fill a module's (possibly sharded) tensors from DCP, resharding as needed.

Every read goes through :mod:`.restricted_dcp`: no checkpoint file is unpickled without restriction.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultSavePlanner, Metadata, TensorStorageMetadata

from .checksums import ChecksummingWriter
from .errors import CheckpointFormatError, CheckpointNotFoundError
from .restricted_dcp import RestrictedFileSystemReader, check_dcp_storage, restricted_dcp_load
from .runtime import single_process_quiet
from .safetensors_io import TensorInfo

MODEL_PREFIX = "model."
"""DCP checkpoints written here keep model tensors under ``model.<state-dict key>``."""
EMA_PREFIX = "ema."
"""... and the EMA of the trainable ones (``training.ema``) under ``ema.<state-dict key>``."""


class _CachedReader(RestrictedFileSystemReader):
    """Restricted reader that parses ``.metadata`` once."""

    _cached: Metadata | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self._cached is None:
            self._cached = super().read_metadata(*args, **kwargs)
        return self._cached


class DcpReader:
    """Read tensors of one DCP directory by key; model keys are exposed without the ``model.`` prefix.

    With ``ema=True`` the tensors a training checkpoint also keeps as an average (``ema.<key>``, the
    trainable parameters of a ``training.ema`` run) are read from there instead, cast to the model
    tensor's dtype; the others (frozen parameters, buffers) stay the model's.

    Opening checks the metadata (restricted unpickling) and that every storage file it names is there
    at full size, so a corrupt or crafted checkpoint fails here with one message naming the file.
    """

    def __init__(self, path: str | os.PathLike, *, ema: bool = False) -> None:
        self.path = Path(path)
        if not (self.path / ".metadata").is_file():
            raise CheckpointNotFoundError(f"{self.path} is not a DCP checkpoint directory (no .metadata)")
        self._reader = _CachedReader(str(self.path))
        meta = self._reader.read_metadata()
        check_dcp_storage(self.path, meta)
        tensors = {k: v for k, v in meta.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
        # Our layout nests model tensors under "model." next to "optimizer." and "ema."; a raw DCP dir does not.
        ours = any(k.startswith(MODEL_PREFIX) for k in tensors) and all(
            k.startswith((MODEL_PREFIX, "optimizer.", EMA_PREFIX)) for k in tensors
        )
        self.prefix = MODEL_PREFIX if ours else ""
        self._meta = {k[len(self.prefix) :]: v for k, v in tensors.items() if k.startswith(self.prefix)}
        self._tensors = tensors
        self._stored = {k: self.prefix + k for k in self._meta}
        if ema:
            self._stored.update(_averaged_keys(self.path, tensors, self._meta))

    def __enter__(self) -> DcpReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to release (files are opened per read); present for symmetry with SafetensorsReader."""

    def keys(self) -> list[str]:
        return list(self._meta)

    def __contains__(self, key: str) -> bool:
        return key in self._meta

    def info(self, key: str) -> TensorInfo:
        try:
            md = self._meta[key]
        except KeyError:
            raise KeyError(f"tensor {key!r} not found in DCP checkpoint {self.path}") from None
        return TensorInfo(tuple(md.size), md.properties.dtype)

    def read(self, key: str, index: Any = None) -> torch.Tensor:
        """Tensor ``key`` (optionally ``tensor[index]``) read in this process only."""
        return self.read_many([key])[key] if index is None else self.read_many([key])[key][tuple(index)]

    def read_many(self, keys: list[str]) -> dict[str, torch.Tensor]:
        """Several tensors in one DCP read (each in its model tensor's dtype)."""
        infos = {k: self.info(k) for k in keys}  # an unknown key: a KeyError naming the checkpoint
        stored = {self._stored[k]: self._tensors[self._stored[k]] for k in keys}
        out = {name: torch.empty(tuple(md.size), dtype=md.properties.dtype) for name, md in stored.items()}
        restricted_dcp_load(out, self.path, reader=self._reader, no_dist=True)
        return {k: out[self._stored[k]].to(infos[k].dtype) for k in keys}


def _averaged_keys(path: Path, tensors: Mapping[str, Any], model: Mapping[str, Any]) -> dict[str, str]:
    """``{model key: its ema.<key> tensor}`` of a training checkpoint; an error when there is none."""
    averaged = {k[len(EMA_PREFIX) :]: k for k in tensors if k.startswith(EMA_PREFIX)}
    if not averaged:
        raise CheckpointFormatError(
            f"{path} holds no EMA weights (no {EMA_PREFIX}* tensors): its run was trained without "
            "training.ema; export the raw weights (leave out --ema)"
        )
    strays = sorted(set(averaged) - set(model))
    if strays:
        raise CheckpointFormatError(
            f"{path}: EMA tensors without a model tensor of the same key: {strays[:5]}"
        )
    return averaged


class _LazySavePlanner(DefaultSavePlanner):
    """Plans from meta tensors; produces each real tensor only when the writer asks for it."""

    def __init__(self, produce: Callable[[str], torch.Tensor]) -> None:
        super().__init__()
        self._produce = produce

    def lookup_object(self, index: Any) -> Any:
        return self._produce(index.fqn)


def save_lazy_dcp(
    layout: Mapping[str, TensorInfo],
    produce: Callable[[str], torch.Tensor],
    out_dir: str | os.PathLike,
    threads: int = 2,
) -> None:
    """Write a single-process DCP checkpoint of ``{model.<key>: produce(key)}``, ``threads`` tensors in memory.

    One ``.distcp`` file per tensor keeps memory bounded (DCP keeps every tensor of a file alive until
    the file is closed); ``threads`` writer threads overlap serialization with fsync. ``produce`` may be
    called from several threads. Each tensor's CRC-32 is recorded (:mod:`.checksums`).
    """
    meta = {MODEL_PREFIX + k: torch.empty(i.shape, dtype=i.dtype, device="meta") for k, i in layout.items()}

    def _produce(fqn: str) -> torch.Tensor:
        return produce(fqn[len(MODEL_PREFIX) :]).contiguous()

    writer = ChecksummingWriter(str(out_dir), single_file_per_rank=False, thread_count=threads)
    with single_process_quiet():
        dcp.save(meta, storage_writer=writer, planner=_LazySavePlanner(_produce), no_dist=True)


def dcp_tensor_layout(path: str | os.PathLike) -> dict[str, TensorInfo]:
    """Model keys -> shape/dtype stored in a DCP directory."""
    reader = DcpReader(path)
    return {k: reader.info(k) for k in reader.keys()}


def load_dcp_into(state: Mapping[str, torch.Tensor], path: str | os.PathLike, prefix: str) -> None:
    """Collectively fill ``state`` (tensors or DTensors, written in place) from ``prefix + key`` in DCP ``path``."""
    restricted_dcp_load({prefix + k: v for k, v in state.items()}, path, allow_partial_load=True)
