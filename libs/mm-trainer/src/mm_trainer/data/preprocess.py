"""What both apps' ``preprocess`` commands share: ranks and device, the encoders' identity, and the call
into ``mm_data.cache_dataset`` with the ``run`` options (docs/DESIGN.md "Latent cache"). The apps supply
only their encoders and what identifies them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from mm_config import PreprocessRunConfig
from mm_data import CacheReport, FileRecords, cache_dataset, tree_digest
from mm_parallel import get_local_device, init_distributed

__all__ = ["WEIGHT_DIGESTS", "preprocess_ranks", "weights_identity", "write_latent_cache"]

WEIGHT_DIGESTS = "weights.digests.json"
"""File in the cache folder keeping the encoders' files' digests while they are unchanged."""


def preprocess_ranks(device: str | None) -> tuple[torch.device, int, int]:
    """``(device, rank, world_size)`` of this preprocess process; under ``torchrun`` the default process
    group is initialized (the ranks split the clips, and a sharded text encoder needs it)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        init_distributed(device_type=torch.device(device).type if device else None)
    chosen = torch.device(device) if device else get_local_device()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    return chosen, rank, world


def weights_identity(out_dir: str | Path, weights: Mapping[str, str | Path | None]) -> dict[str, str | None]:
    """SHA-256 of each named weights folder / file (None stays None), remembered in the cache folder
    (``weights.digests.json``) while the files' sizes and mtimes are unchanged."""
    records = FileRecords(Path(out_dir) / WEIGHT_DIGESTS)
    return {name: tree_digest(path, records) if path else None for name, path in weights.items()}


def write_latent_cache(
    dataset: Any,
    encode: Callable[[dict[str, Any]], Mapping[str, Any]],
    out_dir: str | Path,
    *,
    run: PreprocessRunConfig,
    identity: Mapping[str, Any],
    uses_prompt: bool,
    idle: Callable[[], None] | None = None,
) -> CacheReport:
    """``mm_data.cache_dataset`` with the ``run`` options; ``identity`` gets the cache-relevant ones
    (tiling) added. Rank and world size come from the process group (or 0 / 1)."""
    identity = {
        **identity,
        "vae_tiling": run.vae_tiling,
        "vae_tile": run.vae_tile if run.vae_tiling else None,
    }
    return cache_dataset(
        dataset, encode, out_dir, identity=identity, uses_prompt=uses_prompt, shard_size=run.shard_size,
        num_workers=run.decode_workers, prefetch=run.prefetch, idle=idle,
    )  # fmt: skip
