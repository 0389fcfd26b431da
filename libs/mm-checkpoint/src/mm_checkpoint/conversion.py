"""Conversion of safetensors checkpoints to DCP: online (through a loaded model, with a reusable cache)
and offline (file to file, streaming one tensor at a time).

The online step loads the source with :mod:`.loader` and re-saves it with :mod:`.checkpointer`, so it
and its entry point :func:`load_checkpoint_with_conversion` live here; :mod:`.loader` only loads and
imports nothing from this module."""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .checkpointer import DistributedCheckpointer
from .dcp_io import save_lazy_dcp
from .errors import CheckpointError, CheckpointFormatError, CheckpointNotFoundError
from .export_dir import export_into
from .formats import resolve_load_format, sniff_format
from .info_file import read_info, update_info
from .key_map_registry import get_weight_transform
from .key_maps import KeyPlan, apply_plan, planned_shape_dtype
from .layout import iteration_dir_name, looks_like_dcp_checkpoint_dir, resolve_dcp_dir, write_tracker
from .loader import LoadReport, load_dcp_weights_into, load_safetensors_into
from .module_state import materialize_meta
from .runtime import barrier, get_rank, on_rank0, progress
from .safetensors_io import TensorInfo
from .source_identity import (
    IDENTITY_VERSION,
    changed_names,
    files_identity,
    identity_change,
    needs_refresh,
    source_files,
    source_identity,
)
from .weight_readers import WeightsReader, open_weights

logger = logging.getLogger(__name__)

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
    model: nn.Module,
    out_dir: str | os.PathLike,
    side_files_from: str | os.PathLike | None,
    *,
    source: Mapping[str, Any] | None = None,
) -> Path:
    """Collectively save ``model`` as DCP iteration 0 under ``out_dir`` (+ tracker and the source's side
    files); ``source`` (a :func:`source_identity` record) goes into its ``mm_checkpoint.json``."""
    info = {"source": dict(source)} if source is not None else None
    final = DistributedCheckpointer(out_dir).save({"model": model}, 0, info=info)
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

    A cache is reused only when the source identity it recorded (:mod:`.source_identity`: a SHA-256 of
    each weight file's bytes, key map) matches ``path`` now; otherwise
    (empty, partial, older, or of another or a changed source) it is rebuilt by loading ``path`` into
    ``model`` (strictly) and saving iteration 0, which replaces the old one atomically, with a log line
    saying why. A cache whose recorded source no longer exists is used with a warning.
    """
    if looks_like_dcp_checkpoint_dir(path):
        return Path(path), None
    if conversion_dir is None:
        raise CheckpointFormatError(
            f"load_format is dcp but {path} is not a DCP checkpoint and no conversion dir was given "
            f"(set checkpoint_conversion_dir to cache the converted weights)"
        )
    reason, identity = on_rank0(lambda: _cache_decision(Path(path), Path(conversion_dir), model_type))
    if reason is None:
        return Path(conversion_dir), None
    if get_rank() == 0:
        logger.warning("converting %s to DCP in %s: %s", path, conversion_dir, reason)
    source_format = sniff_format(path)
    if source_format == "dcp":  # pragma: no cover - excluded above
        raise CheckpointFormatError(f"{path} is already DCP")
    load_safetensors_into(model, path, get_weight_transform(model_type), source_format).raise_if_incomplete()
    save_model_as_dcp(model, conversion_dir, side_files_from=path, source=identity)
    return Path(conversion_dir), str(path)


def load_checkpoint_with_conversion(
    model: nn.Module,
    path: str | os.PathLike,
    fmt: str | None = "auto",
    model_type: str | None = None,
    strict: bool = True,
    conversion_dir: str | os.PathLike | None = None,
    *,
    device: torch.device | str | None = None,
) -> LoadReport:
    """Load weights at ``path`` into ``model`` (plain, meta or FSDP2-sharded), converting keys as registered.

    ``fmt`` is sniffed when ``auto``. A declared ``dcp`` with a non-DCP ``path`` triggers the online
    conversion: the source is loaded, saved as DCP iteration 0 under ``conversion_dir`` (reused by later
    calls), and loaded back from there. Meta tensors are materialized on ``device`` (default: inferred)
    first. ``model_type`` selects a key map from ``KEY_MAP_REGISTRY`` for safetensors sources.

    Raises:
        CheckpointLoadError: ``strict`` and keys are missing, unexpected or shape-mismatched.
        CheckpointFormatError / CheckpointNotFoundError: bad path or format, naming what was found.
    """
    resolved = resolve_load_format(path, fmt)
    uninitialized = materialize_meta(model, device)
    converted_from = None
    if resolved == "dcp":
        dcp_path, converted_from = ensure_dcp_cache(model, path, conversion_dir, model_type=model_type)
        report = load_dcp_weights_into(model, dcp_path)
    else:
        report = load_safetensors_into(model, path, get_weight_transform(model_type), resolved)
    report.uninitialized_buffers = uninitialized
    report.converted_from = converted_from
    if uninitialized:
        logger.warning(
            "non-persistent buffers left uninitialized after meta materialization: %s", uninitialized
        )
    if strict:
        report.raise_if_incomplete()
    return report


def _cache_decision(
    path: Path, cache: Path, model_type: str | None
) -> tuple[str | None, dict[str, Any] | None]:
    """``(why the cache must be rebuilt or None, the source's identity)``; run on rank 0."""
    recorded, problem = _recorded_source(cache)
    if not path.exists():
        if recorded and recorded.get("path") == str(path.resolve()):
            logger.warning("%s no longer exists: using its conversion in %s unchecked", path, cache)
            return None, None
        raise CheckpointNotFoundError(
            f"weights source {path} does not exist (the conversion cache {cache} holds "
            f"{recorded.get('path') if recorded else 'no recorded source'})"
        )
    current = source_identity(path, model_type, recorded=recorded)
    change = problem or identity_change(recorded, current)
    if change is None and needs_refresh(recorded, current):  # same bytes, new times: hash once, not every run
        update_info(resolve_dcp_dir(cache)[0], source=current)
    return change, current


def cache_content_change(path: str | os.PathLike, conversion_dir: str | os.PathLike) -> str | None:
    """Why the conversion cache ``conversion_dir`` does not hold ``path``'s current content (its recorded
    file hashes against the source's now), or None when it does. The key map is not checked (a caller
    that knows the model type gets that from :func:`ensure_dcp_cache`); for staging a cache: a stale one
    is converted again on the shared storage rather than copied to every node."""
    recorded, problem = _recorded_source(Path(conversion_dir))
    if problem or not recorded:
        return problem or "it records no source identity"
    if recorded.get("version") != IDENTITY_VERSION:
        return "its record format is older"
    current = files_identity(((f, f.name) for f in source_files(Path(path).resolve())), recorded.get("files"))
    changed = changed_names(recorded.get("files") or [], current)
    return f"the content of the weight files changed ({', '.join(changed)})" if changed else None


def _recorded_source(cache: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The source identity recorded in conversion cache ``cache``, or why there is no usable one."""
    if not looks_like_dcp_checkpoint_dir(cache):
        return None, "the cache holds no complete conversion"
    try:
        dcp_dir, _ = resolve_dcp_dir(cache)
        recorded = (read_info(dcp_dir) or {}).get("source")
    except CheckpointError as exc:
        return None, f"the cache is unreadable ({exc})"
    return (recorded if isinstance(recorded, dict) else None), None


def convert_to_dcp(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    src_format: str = "auto",
    model_type: str | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Convert a safetensors checkpoint (or a ``.pth`` state dict, or a ComfyUI single file) to a DCP root (``iter_0000000`` + tracker + side files), file to file.

    Tensors are renamed by the ``model_type`` key map (if any) and streamed one at a time, so memory
    stays at about one tensor. Returns the iteration directory.
    """
    fmt = resolve_load_format(src, src_format)
    if fmt == "dcp":
        raise CheckpointFormatError(f"{src} is already a DCP checkpoint; nothing to convert")
    with export_into(dst, sources=(src,)) as staging:
        if get_rank() == 0:
            _convert_to_dcp(src, staging, model_type=model_type, dtype=dtype)
    return Path(dst) / iteration_dir_name(0)


def _convert_to_dcp(
    src: str | os.PathLike, dst: Path, *, model_type: str | None, dtype: torch.dtype | None
) -> None:
    final = dst / iteration_dir_name(0)
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with open_weights(src, zero_copy=True) as reader:
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


def _planned_info(reader: WeightsReader, plan: KeyPlan, dtype: torch.dtype | None) -> TensorInfo:
    shape, out_dtype = planned_shape_dtype(plan, [(i.shape, i.dtype) for i in map(reader.info, plan.sources)])
    return TensorInfo(shape, dtype or out_dtype)
