"""Frozen encoders for a preprocess run: loaded once per rank in their dtype, the text encoder sharded
over the ranks with FSDP2 when it is large, the VAE tiled where the resolution needs it
(docs/DESIGN.md "Latent cache").

A sharded encoder gathers its parameters from every rank in each forward, so every rank must call it
equally often: ``mm_data.cache_dataset(idle=...)`` pads the ranks with fewer samples.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from mm_checkpoint import materialize_meta
from mm_parallel import match_modules
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from mm_trainer.model.hub import ModelHub

__all__ = [
    "FSDP_AUTO_BYTES",
    "enable_vae_tiling",
    "load_frozen",
    "shard_frozen",
    "use_text_encoder_fsdp",
    "weights_bytes",
]

FSDP_AUTO_BYTES = 4 * 2**30
"""``text_encoder_fsdp: auto`` shards an encoder whose weight files exceed this (UMT5-XXL: ~11 GB bf16)."""
_WEIGHT_SUFFIXES = {".safetensors", ".bin", ".pth", ".pt"}


def weights_bytes(path: str | Path | None) -> int:
    """Bytes of the weight files under ``path`` (a folder or one file); 0 when it does not exist."""
    root = Path(path) if path else None
    if root is None or not root.exists():
        return 0
    files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files if p.suffix in _WEIGHT_SUFFIXES)


def use_text_encoder_fsdp(mode: bool | str, *, weights: str | Path | None, world_size: int) -> bool:
    """Whether to shard the text encoder (``run.text_encoder_fsdp``): true, false, or ``"auto"``: more than
    one rank and weight files above :data:`FSDP_AUTO_BYTES`. True with one rank is a 1-rank shard."""
    if mode == "auto":
        return world_size > 1 and weights_bytes(weights) > FSDP_AUTO_BYTES
    if not isinstance(mode, bool):
        raise ValueError(f"text_encoder_fsdp must be true, false or 'auto', got {mode!r}")
    return mode


def shard_frozen(module: nn.Module, *, blocks: str, device: torch.device) -> nn.Module:
    """``fully_shard`` every module matching the pattern ``blocks`` (e.g. ``encoder.block.{*}``), then the
    root, over all ranks of the default process group (one mesh axis); parameters are gathered per block
    in the forward and freed after it."""
    if not dist.is_initialized():
        raise RuntimeError("shard_frozen needs torch.distributed initialized (mm_parallel.init_distributed)")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for path in match_modules(module, [blocks], what="text encoder blocks")[blocks]:
        fully_shard(module.get_submodule(path), mesh=mesh, reshard_after_forward=True)
    fully_shard(module, mesh=mesh, reshard_after_forward=True)
    return module


def _materialize(module: nn.Module, device: torch.device, what: str) -> None:
    lost = materialize_meta(module, device)
    rebuild = getattr(module, "init_non_persistent_buffers", None)
    if callable(rebuild):
        rebuild()
    elif lost:
        raise ValueError(f"{what}: a meta build leaves non-persistent buffers {lost} uninitialized")


def load_frozen(
    args: Any, *, device: torch.device, shard_blocks: str | None = None, what: str = "encoder"
) -> nn.Module:
    """A frozen sub-model from its section ``args`` (``model_id``, ``from_pretrained``, ``dtype``, ...):
    built on meta in its dtype, sharded with :func:`shard_frozen` when ``shard_blocks`` names its blocks,
    allocated on ``device`` and loaded by its ``setup_weights`` (each rank reads its own slices), so no rank
    holds a full-precision copy. A load that finds no weights raises."""
    model = ModelHub.build(args, meta_init=True)
    if shard_blocks is not None:
        shard_frozen(model, blocks=shard_blocks, device=device)
    _materialize(model, device, what)
    setup = getattr(model, "setup_weights", None)
    if not callable(setup) or setup(args) is None:
        raise FileNotFoundError(f"{what}: no weights loaded from {getattr(args, 'from_pretrained', None)!r}")
    return model.eval().requires_grad_(False)


def enable_vae_tiling(vae: Any, tile: int | None) -> None:
    """diffusers' ``enable_tiling`` on a video VAE (``AutoencoderKLWan``, ``AutoencoderKLLTX2Video``): inputs
    larger than ``tile`` pixels (height or width; None: the VAE's default) encode in tiles overlapping by
    a quarter."""
    if tile is None:
        vae.enable_tiling()
        return
    stride = max(8, tile * 3 // 4)
    vae.enable_tiling(
        tile_sample_min_height=tile, tile_sample_min_width=tile,
        tile_sample_stride_height=stride, tile_sample_stride_width=stride,
    )  # fmt: skip
