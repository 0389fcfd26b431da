"""What both apps' ``preprocess`` commands share: ranks and device, the encoders' identity, the recipe
recorded in the cache, and the call into ``mm_data.cache_dataset`` with the ``run`` options
(docs/DESIGN.md "Latent cache"). The apps supply only their encoders and what identifies them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from mm_config import PreprocessRunConfig
from mm_data import CacheReport, FileRecords, cache_dataset, from_rank0, tree_digest
from mm_parallel import get_local_device, init_distributed

__all__ = [
    "PREPROCESS_SECTION",
    "RUN_ONLY_KEYS",
    "WEIGHT_DIGESTS",
    "preprocess_ranks",
    "preprocess_recipe",
    "weights_identity",
    "write_latent_cache",
]

WEIGHT_DIGESTS = "weights.digests.json"
"""File in the cache folder keeping the encoders' files' digests (each file hashed again every run: the
records only name the files that changed in place)."""
PREPROCESS_SECTION = "data.dataset.preprocess"
"""Where a config holds the preprocess section (the prefix of a recipe's keys)."""
RUN_ONLY_KEYS = ("device", "run.shard_size", "run.decode_workers", "run.prefetch", "run.text_encoder_fsdp")
"""Keys of a preprocess section that say how the preprocess runs, not what it writes: left out of the
recipe (a cache written on 8 ranks with sharded UMT5 is byte for byte the cache of one process)."""


def preprocess_ranks(device: str | None) -> tuple[torch.device, int, int]:
    """``(device, rank, world_size)`` of this preprocess process; under ``torchrun`` the default process
    group is initialized (the ranks split the clips, and a sharded text encoder needs it)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        init_distributed(device_type=torch.device(device).type if device else None)
    chosen = torch.device(device) if device else get_local_device()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    return chosen, rank, world


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists and empty dicts stay values)."""
    if not isinstance(value, Mapping) or not value:
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, item in value.items():
        out.update(_flat(item, f"{prefix}.{key}" if prefix else str(key)))
    return out


def preprocess_recipe(options: Any) -> dict[str, Any]:
    """The keys of a validated preprocess section (a pydantic model) that decide what its cache holds, as
    ``{"data.dataset.preprocess.<dotted key>": value}``, defaults included: all but :data:`RUN_ONLY_KEYS`
    (and ``run.vae_tile`` without ``run.vae_tiling``). What ``preprocess`` records in the cache and a
    training run compares its own section with (:func:`mm_trainer.check_cache_made_as_configured`)."""
    flat = _flat(options.model_dump(mode="json"))
    if not flat.get("run.vae_tiling", False):
        flat.pop("run.vae_tile", None)
    return {f"{PREPROCESS_SECTION}.{key}": value for key, value in flat.items() if key not in RUN_ONLY_KEYS}


def weights_identity(out_dir: str | Path, weights: Mapping[str, str | Path | None]) -> dict[str, str | None]:
    """SHA-256 of each named weights folder / file (None stays None), every file hashed from its bytes on
    every call (a rewrite that keeps the size and restores the mtime is seen). Under ``torchrun`` rank 0
    hashes and the others receive its digests; the records in the cache folder (``weights.digests.json``)
    name the files found changed in place."""
    records = FileRecords(Path(out_dir) / WEIGHT_DIGESTS)

    def digests() -> dict[str, str | None]:
        return {
            name: tree_digest(path, records, verify=True) if path else None for name, path in weights.items()
        }

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return digests()
    return from_rank0(digests, dist.new_group(backend="gloo"))


def write_latent_cache(
    dataset: Any,
    encode: Callable[[dict[str, Any]], Mapping[str, Any]],
    out_dir: str | Path,
    *,
    run: PreprocessRunConfig,
    identity: Mapping[str, Any],
    uses_prompt: bool,
    idle: Callable[[], None] | None = None,
    recipe: Mapping[str, Any] | None = None,
) -> CacheReport:
    """``mm_data.cache_dataset`` with the ``run`` options; ``identity`` gets the cache-relevant ones
    (tiling) added; ``recipe`` (:func:`preprocess_recipe` of the section) is recorded in the cache. Rank
    and world size come from the process group (or 0 / 1)."""
    identity = {
        **identity,
        "vae_tiling": run.vae_tiling,
        "vae_tile": run.vae_tile if run.vae_tiling else None,
    }
    return cache_dataset(
        dataset, encode, out_dir, identity=identity, recipe=recipe, uses_prompt=uses_prompt,
        shard_size=run.shard_size, num_workers=run.decode_workers, prefetch=run.prefetch, idle=idle,
    )  # fmt: skip
