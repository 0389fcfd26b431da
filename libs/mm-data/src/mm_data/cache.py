"""`cache_dataset`: run the user's encoders over a dataset once, one file per sample, resumably."""

from __future__ import annotations

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

__all__ = ["CacheReport", "cache_dataset", "cache_file_name"]


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
    rank: int = 0,
    world_size: int = 1,
    progress: bool = True,
) -> CacheReport:
    """Encode this rank's share of ``dataset`` (indices ``rank::world_size``) into ``out_dir``.

    ``encode_fn(item)`` returns tensors (``latents``, ``prompt_embeds``, ``prompt_attention_mask``, ...)
    and optionally other values or a ``metadata`` dict, stored as JSON in the file's header
    (``prompt``, ``index`` and ``path`` are added unless given). Complete files are skipped, so an
    interrupted run can simply be rerun; files appear atomically (temporary file + rename). A bad
    sample (the dataset replaced it) is reported and not cached.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
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
            report.bad.append(_bad(dataset, index))
            continue
        tensors, metadata = _split(encode_fn(item))
        metadata.setdefault("index", index)
        metadata.setdefault("prompt", item.get("prompt", ""))
        if hasattr(dataset, "rows"):
            metadata.setdefault("path", dataset.rows[index]["path"])
        save_precomputed(path, tensors, metadata)
        report.written.append(index)
    report.seconds = time.perf_counter() - start
    return report


def _bad(dataset: Any, index: int) -> BadSample:
    for bad in getattr(dataset, "bad_samples", []):
        if bad.index == index:
            return bad
    path = dataset.rows[index]["path"] if hasattr(dataset, "rows") else "?"
    return BadSample(index, str(path), "replaced by the next sample")
