"""Conversion of safetensors checkpoints to DCP: online (through a loaded model, with a reusable cache)
and offline (file to file, streaming one tensor at a time)."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import torch
from torch import nn

from .checkpointer import DistributedCheckpointer
from .dcp_io import save_lazy_dcp
from .errors import CheckpointFormatError
from .formats import sniff_format
from .key_maps import KeyPlan, apply_plan, get_weight_transform, planned_shape_dtype
from .layout import iteration_dir_name, looks_like_dcp_checkpoint_dir, write_tracker
from .runtime import barrier, broadcast_object, get_rank, progress
from .safetensors_io import SafetensorsReader, TensorInfo

SIDE_FILE_LIMIT = 16 * 1024 * 1024
_WEIGHT_SUFFIXES = (
    ".safetensors",
    ".safetensors.index.json",
    ".bin",
    ".bin.index.json",
    ".pt",
    ".pth",
    ".distcp",
)


def copy_side_files(src: str | os.PathLike, dst: str | os.PathLike) -> list[str]:
    """Copy small non-weight files (``config.json``, tokenizer files...) from dir ``src`` into ``dst``."""
    src, dst = Path(src), Path(dst)
    if not src.is_dir():
        return []
    copied = []
    for f in sorted(src.iterdir()):
        if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES) and f.stat().st_size <= SIDE_FILE_LIMIT:
            if f.name.startswith(".") or f.name in (
                "latest_checkpointed_iteration.txt",
                "mm_checkpoint.json",
            ):
                continue
            dst.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dst / f.name)
            copied.append(f.name)
    return copied


def save_model_as_dcp(
    model: nn.Module, out_dir: str | os.PathLike, side_files_from: str | os.PathLike | None
) -> Path:
    """Collectively save ``model`` as DCP iteration 0 under ``out_dir`` (+ tracker and the source's side files)."""
    final = DistributedCheckpointer(out_dir).save({"model": model}, 0)
    if get_rank() == 0 and side_files_from is not None:
        copy_side_files(side_files_from, out_dir)
    barrier()
    return final


def ensure_dcp_cache(
    model: nn.Module,
    path: str | os.PathLike,
    conversion_dir: str | os.PathLike | None,
    model_type: str | None = None,
) -> tuple[Path, str | None]:
    """Return ``(dcp_path, converted_from)``: ``path`` if it is DCP, else the (possibly new) cache.

    A cache that already looks like DCP is reused without reading the source; an empty or partial
    one is rebuilt by loading ``path`` into ``model`` (strictly) and saving iteration 0.
    """
    if looks_like_dcp_checkpoint_dir(path):
        return Path(path), None
    if conversion_dir is None:
        raise CheckpointFormatError(
            f"load_format is dcp but {path} is not a DCP checkpoint and no conversion dir was given "
            f"(set checkpoint_conversion_dir to cache the converted weights)"
        )
    if not broadcast_object(not looks_like_dcp_checkpoint_dir(conversion_dir)):
        return Path(conversion_dir), None
    from .loader import load_safetensors_into

    source_format = sniff_format(path)
    if source_format == "dcp":  # pragma: no cover - excluded above
        raise CheckpointFormatError(f"{path} is already DCP")
    load_safetensors_into(model, path, get_weight_transform(model_type), source_format).raise_if_incomplete()
    save_model_as_dcp(model, conversion_dir, side_files_from=path)
    return Path(conversion_dir), str(path)


def convert_to_dcp(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    src_format: str = "auto",
    model_type: str | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Convert a safetensors checkpoint to a DCP root (``iter_0000000`` + tracker + side files), file to file.

    Tensors are renamed by the ``model_type`` key map (if any) and streamed one at a time, so memory
    stays at about one tensor. Returns the iteration directory.
    """
    from .formats import resolve_load_format

    fmt = resolve_load_format(src, src_format)
    if fmt == "dcp":
        raise CheckpointFormatError(f"{src} is already a DCP checkpoint; nothing to convert")
    dst = Path(dst)
    final = dst / iteration_dir_name(0)
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with SafetensorsReader(src, zero_copy=True) as reader:
        plans = get_weight_transform(model_type).plan_load(reader.keys())
        layout = {k: _planned_info(reader, p, dtype) for k, p in plans.items()}
        bar = iter(progress(range(len(plans)), desc=f"convert {Path(src).name} -> dcp", total=len(plans)))
        lock = threading.Lock()

        def produce(key: str) -> torch.Tensor:  # called from DCP writer threads
            with lock:
                next(bar, None)
            plan = plans[key]
            tensor = apply_plan(plan, [reader.read(s) for s in plan.sources])
            return tensor if dtype is None else tensor.to(dtype)

        save_lazy_dcp(layout, produce, partial)
    if final.exists():
        shutil.rmtree(final)
    os.replace(partial, final)
    write_tracker(dst, 0)
    if Path(src).is_dir():
        copy_side_files(src, dst)
    return final


def _planned_info(reader: SafetensorsReader, plan: KeyPlan, dtype: torch.dtype | None) -> TensorInfo:
    shape, out_dtype = planned_shape_dtype(plan, [(i.shape, i.dtype) for i in map(reader.info, plan.sources)])
    return TensorInfo(shape, dtype or out_dtype)
