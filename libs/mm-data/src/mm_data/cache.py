"""`cache_dataset`: run the user's encoders over a dataset once, one file per sample, resumably.

A cache folder holds ``cache.json`` (the source dataset's length and bucket id per index: the sample
order of a run over the cache is the order over the source), one ``NNNNNNNN.safetensors`` per encoded
sample, and one ``NNNNNNNN.bad.json`` (path, reason) per sample the source could not read.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from tqdm.auto import tqdm

from .bad_samples import BadSample
from .precomputed import save_precomputed

__all__ = [
    "CACHE_MANIFEST",
    "CacheReport",
    "bad_marker_name",
    "cache_dataset",
    "cache_file_name",
    "read_cache_manifest",
]

CACHE_MANIFEST = "cache.json"
"""Name of the manifest file in a cache folder."""


@dataclass
class CacheReport:
    """What one rank did: indices written, skipped (already complete) and bad (not cached)."""

    out_dir: str
    rank: int
    world_size: int
    written: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    bad: list[BadSample] = field(default_factory=list)
    seconds: float = 0.0

    def __str__(self) -> str:
        lines = [
            f"rank {self.rank}/{self.world_size}: wrote {len(self.written)}, kept {len(self.skipped)} "
            f"existing, {len(self.bad)} bad, in {self.seconds:.1f}s -> {self.out_dir}"
        ]
        lines += [f"  bad [{b.index}] {b.path}: {b.reason}" for b in self.bad]
        return "\n".join(lines)


def cache_file_name(index: int) -> str:
    """File name of sample ``index`` in a cache folder."""
    return f"{index:08d}.safetensors"


def bad_marker_name(index: int) -> str:
    """File name of the marker of sample ``index`` that the source could not read (not cached)."""
    return f"{index:08d}.bad.json"


def read_cache_manifest(root: str | Path) -> dict[str, Any]:
    """``cache.json`` of a cache folder: ``num_samples`` and ``bucket_ids`` of the source dataset."""
    path = Path(root) / CACHE_MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no cache manifest; write the cache with mm_data.cache_dataset")
    manifest = json.loads(path.read_text())
    if len(manifest.get("bucket_ids", [])) != manifest.get("num_samples"):
        raise ValueError(f"{path}: bucket_ids must list one bucket per sample (num_samples)")
    return manifest


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _write_manifest(dataset: Any, out: Path) -> None:
    """Every rank writes the same manifest (atomically), so any rank's share finishes it."""
    bucket_ids = [int(b) for b in getattr(dataset, "bucket_ids", [0] * len(dataset))]
    _write_json(out / CACHE_MANIFEST, {"num_samples": len(dataset), "bucket_ids": bucket_ids})


def _is_complete(path: Path) -> bool:
    if not path.is_file():
        return False
    try:
        with safe_open(str(path), framework="pt") as f:
            return len(list(f.keys())) > 0
    except (SafetensorError, OSError, ValueError):
        return False


def _split(encoded: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {k: v for k, v in encoded.items() if isinstance(v, torch.Tensor)}
    metadata = dict(encoded.get("metadata", {}) or {})
    metadata.update({k: v for k, v in encoded.items() if k != "metadata" and not isinstance(v, torch.Tensor)})
    if not tensors:
        raise ValueError(f"encode_fn returned no tensors (keys {sorted(encoded)})")
    return tensors, metadata


def cache_dataset(
    dataset: Any,
    encode_fn: Callable[[dict[str, Any]], Mapping[str, Any]],
    out_dir: str | Path,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    progress: bool = True,
) -> CacheReport:
    """Encode this rank's share of ``dataset`` (indices ``rank::world_size``) into ``out_dir``.

    ``encode_fn(item)`` returns tensors (``latents``, ``prompt_embeds``, ``prompt_attention_mask``, ...)
    and optionally other values or a ``metadata`` dict, stored as JSON in the file's header
    (``prompt``, ``index`` and ``path`` are added unless given). Complete files are skipped, so an
    interrupted run can simply be rerun (bad samples are tried again); files appear atomically
    (temporary file + rename). A bad sample (the dataset replaced it) is reported, not cached, and
    marked ``NNNNNNNN.bad.json``; ``cache.json`` records the dataset's length and buckets.
    ``rank`` / ``world_size`` default to torchrun's ``RANK`` / ``WORLD_SIZE`` (0 / 1 without it).
    """
    rank = int(os.environ.get("RANK", 0)) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _write_manifest(dataset, out)
    report = CacheReport(str(out), rank, world_size)
    start = time.perf_counter()
    indices = range(rank, len(dataset), world_size)
    bar = tqdm(indices, desc=f"cache rank {rank}", disable=not progress or rank != 0)
    for index in bar:
        path = out / cache_file_name(index)
        if _is_complete(path):
            report.skipped.append(index)
            continue
        item = dataset[index]
        if int(item.get("index", index)) != index:
            bad = _bad(dataset, index)
            _write_json(out / bad_marker_name(index), {"path": bad.path, "reason": bad.reason})
            report.bad.append(bad)
            continue
        tensors, metadata = _split(encode_fn(item))
        metadata.setdefault("index", index)
        metadata.setdefault("prompt", item.get("prompt", ""))
        if hasattr(dataset, "rows"):
            metadata.setdefault("path", dataset.rows[index]["path"])
        save_precomputed(path, tensors, metadata)
        (out / bad_marker_name(index)).unlink(missing_ok=True)  # a sample fixed since an earlier run
        report.written.append(index)
    report.seconds = time.perf_counter() - start
    return report


def _bad(dataset: Any, index: int) -> BadSample:
    for bad in getattr(dataset, "bad_samples", []):
        if bad.index == index:
            return bad
    path = dataset.rows[index]["path"] if hasattr(dataset, "rows") else "?"
    return BadSample(index, str(path), "replaced by the next sample")
