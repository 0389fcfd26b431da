"""Export a DCP checkpoint to sharded diffusers / HF safetensors that upstream ``from_pretrained`` loads."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from .conversion import copy_side_files
from .dcp_io import DcpReader
from .errors import CheckpointFormatError, ContainerCheckpointError
from .export_dir import export_into
from .formats import DIFFUSERS_WEIGHTS_PREFIX, HF_WEIGHTS_PREFIX, normalize_format
from .info_file import SOURCES_INFO_KEY, SUBMODELS_INFO_KEY, read_info
from .key_map_registry import get_weight_transform, known_model_types
from .key_maps import KeyPlan, apply_plan, planned_shape_dtype
from .layout import resolve_dcp_dir
from .runtime import barrier, get_rank, progress
from .safetensors_io import (
    PendingTensor,
    TensorInfo,
    parse_size,
    plan_shards,
    shard_filenames,
    write_index,
    write_safetensors_file,
)

logger = logging.getLogger(__name__)


def _pending(
    reader: DcpReader | SubmoduleReader, key: str, plan: KeyPlan, dtype: torch.dtype | None
) -> PendingTensor:
    shape, out_dtype = planned_shape_dtype(plan, [(i.shape, i.dtype) for i in map(reader.info, plan.sources)])
    final_dtype = dtype or out_dtype

    def produce() -> torch.Tensor:
        parts = reader.read_many(list(plan.sources))
        return apply_plan(plan, [parts[s] for s in plan.sources]).to(final_dtype)

    return PendingTensor(key, TensorInfo(shape, final_dtype), produce)


def export_checkpoint(
    dcp_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    to: str = "diffusers",
    model_type: str | None = None,
    config_from: str | os.PathLike | None = None,
    max_shard_size: int | str = "5GB",
    *,
    iteration: int | None = None,
    dtype: torch.dtype | None = None,
    submodule: str | None = None,
    ema: bool = False,
) -> Path:
    """Consolidate the model tensors of a DCP checkpoint into sharded safetensors under ``out_dir``.

    ``submodule`` exports one sub-model of a container checkpoint (e.g. ``predictor``: the keys
    under ``predictor.``, written without that prefix). A checkpoint that records sub-models (a
    training run's, see ``DistributedCheckpointer.save(submodels=...)``) needs one: without it
    :class:`ContainerCheckpointError` lists them and the known model types.

    ``to`` picks file names: ``diffusers`` -> ``diffusion_pytorch_model*.safetensors``, ``hf`` /
    ``safetensors`` -> ``model*.safetensors`` (+ ``*.safetensors.index.json`` when sharded). Keys are
    mapped back through the ``model_type`` key map. Side files (``config.json``...) come from
    ``config_from`` if given, else from the DCP root (where ``convert`` keeps them). Tensors are read
    and written one at a time. Runs on rank 0 only when a process group exists.

    ``ema=True`` writes the checkpoint's EMA of the trainable parameters (``training.ema``) in place of
    their raw values (frozen parameters and buffers as saved); a checkpoint without one is an error.
    """
    target = normalize_format(to)
    if target not in {"diffusers", "hf", "safetensors"}:
        raise CheckpointFormatError(f"cannot export to {to!r}; expected diffusers, hf or safetensors")
    path, _ = resolve_dcp_dir(dcp_dir, iteration)
    if submodule is None:
        refuse_container(path)
    with export_into(out_dir, sources=(path, config_from)) as out:
        if get_rank() == 0:
            reader = DcpReader(path, ema=ema)
            reader = reader if submodule is None else SubmoduleReader(reader, submodule)
            _export(reader, out, target, model_type, parse_size(max_shard_size), dtype)
            _copy_config(Path(dcp_dir), path, config_from, out, submodule)
    return Path(out_dir)


def export_single_file(
    dcp_dir: str | os.PathLike,
    out_file: str | os.PathLike,
    *,
    model_type: str | None = None,
    key_prefix: str = "",
    metadata: dict[str, str] | None = None,
    submodule: str | None = None,
    iteration: int | None = None,
    dtype: torch.dtype | None = None,
    ema: bool = False,
) -> Path:
    """The model tensors of a DCP checkpoint as ONE safetensors file ``out_file``: each key mapped back
    through ``model_type``'s key map and prefixed with ``key_prefix`` (e.g. ``model.diffusion_model.``,
    the layout of ComfyUI's and the official LTX-2 single files), ``metadata`` (string to string) in its
    header. Streamed tensor by tensor; the file appears whole or not at all (an earlier file at
    ``out_file`` is replaced). ``submodule`` / ``ema`` / ``iteration`` as in :func:`export_checkpoint`.
    Rank 0 writes.

    Raises:
        CheckpointFormatError: ``out_file`` is not a ``.safetensors`` path, or is a folder.
    """
    out = Path(out_file)
    if out.suffix != ".safetensors" or out.is_dir():
        raise CheckpointFormatError(f"{out}: a single-file export is written as a .safetensors file")
    path, _ = resolve_dcp_dir(dcp_dir, iteration)
    if submodule is None:
        refuse_container(path)
    if get_rank() == 0:
        reader = DcpReader(path, ema=ema)
        reader = reader if submodule is None else SubmoduleReader(reader, submodule)
        plans = get_weight_transform(model_type).plan_export(reader.keys())
        pending = [_pending(reader, key, plan, dtype) for key, plan in plans.items()]
        pending = [PendingTensor(key_prefix + t.key, t.info, t.produce) for t in pending]
        out.parent.mkdir(parents=True, exist_ok=True)
        written = progress(
            write_safetensors_file(out, pending, metadata), desc="export -> one file", total=len(pending)
        )
        for _ in written:
            pass
    barrier()
    return out


def refuse_container(dcp_path: Path) -> None:
    """Raise :class:`ContainerCheckpointError` when the DCP iteration dir ``dcp_path`` records sub-models."""
    recorded = (read_info(dcp_path) or {}).get(SUBMODELS_INFO_KEY)
    if recorded:
        raise ContainerCheckpointError(
            f"{dcp_path} is a training checkpoint of a model container with sub-models {recorded}: choose "
            f"one (mm-ckpt convert --submodel NAME, export_checkpoint(submodule=NAME)) and the key layout "
            f"to write with --model-type (known model types: {known_model_types()}; without one the "
            "trained keys are written)"
        )


class SubmoduleReader:
    """A :class:`DcpReader` restricted to the keys under ``<submodule>.``, shown without the prefix."""

    def __init__(self, reader: DcpReader, submodule: str) -> None:
        self.reader, self.prefix = reader, submodule.rstrip(".") + "."
        if not self.keys():
            tops = sorted({k.split(".", 1)[0] for k in reader.keys()})
            raise CheckpointFormatError(
                f"{reader.path} has no tensors under {submodule!r}; its top-level names: {tops}"
            )

    def keys(self) -> list[str]:
        n = len(self.prefix)
        return [k[n:] for k in self.reader.keys() if k.startswith(self.prefix)]

    def info(self, key: str) -> Any:
        return self.reader.info(self.prefix + key)

    def read_many(self, keys: list[str]) -> dict[str, torch.Tensor]:
        full = self.reader.read_many([self.prefix + k for k in keys])
        return {k: full[self.prefix + k] for k in keys}


def _export(
    reader: DcpReader | SubmoduleReader,
    out: Path,
    target: str,
    model_type: str | None,
    max_bytes: int,
    dtype: torch.dtype | None,
) -> None:
    plans = get_weight_transform(model_type).plan_export(reader.keys())
    pending = [_pending(reader, key, plan, dtype) for key, plan in plans.items()]
    prefix = DIFFUSERS_WEIGHTS_PREFIX if target == "diffusers" else HF_WEIGHTS_PREFIX
    shards = plan_shards(pending, max_bytes)
    names = shard_filenames(prefix, len(shards))
    out.mkdir(parents=True, exist_ok=True)
    written = progress(
        (key for shard, name in zip(shards, names) for key in write_safetensors_file(out / name, shard)),
        desc=f"export -> {target}",
        total=len(pending),
        unit="tensor",
    )
    for _ in written:
        pass
    if len(shards) > 1:
        write_index(out, prefix, shards, names)


def _copy_config(
    root: Path, dcp_path: Path, config_from: str | os.PathLike | None, out: Path, submodule: str | None = None
) -> None:
    """Side files (``config.json``...) from ``config_from``, else from the weights source a training run
    recorded for the exported sub-model (``sources`` in ``mm_checkpoint.json``: never the run root's
    own files, its ``config.yaml`` and ``metrics.jsonl``), else from the DCP root (``mm-ckpt convert``
    keeps the source's side files there)."""
    recorded = (read_info(dcp_path) or {}).get(SOURCES_INFO_KEY)
    if config_from is not None:
        sources = [Path(config_from)]
    elif recorded is not None:
        source = recorded.get(submodule or "model")
        sources = [Path(source)] if source else []
    else:
        sources = [root, dcp_path.parent]
    for src in sources:
        if copy_side_files(src, out):
            break
    if not (out / "config.json").is_file():
        logger.warning(
            "%s has no config.json: upstream from_pretrained needs one (pass config_from=...)", out
        )
