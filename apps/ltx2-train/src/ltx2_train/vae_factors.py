"""The video VAE's compression, read from the model set's ``vae/config.json``, and the sizes it takes.

LTX-2.0's VAE compresses 8 x 32 x 32 (time, height, width), but the factors are the checkpoint's: the tiny set's
is 2 x 4 x 4, and later releases may change them. They are what diffusers' ``AutoencoderKLLTX2Video`` declares
(``temporal_compression_ratio`` / ``spatial_compression_ratio``: the config's values, or ``patch_size`` x
2^scalings where it leaves them out), which its LTX-2 pipelines size latents with. A clip is encodable when
``frames - 1`` divides by the temporal factor (frames = 1 + k x t: 8k+1 for LTX-2.0) and its height and width by
the spatial one; and the transformer's ``vae_scale_factors`` (the RoPE grid's scale: a latent coordinate times
it is a pixel coordinate) must be the VAE's, or every position the transformer sees is off.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from diffusers import AutoencoderKLLTX2Video


def vae_config_file(model_root: str | Path) -> Path:
    return Path(model_root) / "vae" / "config.json"


def video_vae_factors(model_root: str | Path) -> tuple[int, int] | None:
    """``(temporal, spatial)`` compression of ``model_root``'s video VAE, None without a ``vae/config.json``."""
    path = vae_config_file(model_root)
    if not path.is_file():
        return None
    params = inspect.signature(AutoencoderKLLTX2Video.__init__).parameters
    config = {k: p.default for k, p in params.items() if k != "self"} | json.loads(path.read_text())
    scalings = sum(bool(s) for s in config["spatio_temporal_scaling"])
    spatial = config["spatial_compression_ratio"] or config["patch_size"] * 2**scalings
    temporal = config["temporal_compression_ratio"] or config["patch_size_t"] * 2**scalings
    return int(temporal), int(spatial)


def clip_size_problem(
    factors: tuple[int, int], where: Any, num_frames: int, height: int, width: int
) -> str | None:
    """Why a clip of ``num_frames`` x ``height`` x ``width`` does not fit the VAE of ``factors`` (read from
    ``where``), or None."""
    temporal, spatial = factors
    if (num_frames - 1) % temporal == 0 and height % spatial == 0 and width % spatial == 0:
        return None
    return (
        f"{num_frames} frames of {height} x {width}: the video VAE ({where}) compresses time x{temporal} and "
        f"space x{spatial}, so it takes 1 + k x {temporal} frames ({temporal}k+1) and heights and widths that are "
        f"multiples of {spatial}"
    )


def scale_factor_problem(
    factors: tuple[int, int], where: Any, transformer: Mapping[str, Any], transformer_where: Any
) -> str | None:
    """Why a transformer of config ``transformer`` (read from ``transformer_where``) does not fit the VAE of
    ``factors``: its ``vae_scale_factors`` (time, height, width) are not the VAE's; None when they are."""
    declared: Sequence[int] = transformer.get("vae_scale_factors", (8, 32, 32))
    temporal, spatial = factors
    if tuple(int(f) for f in declared) == (temporal, spatial, spatial):
        return None
    return (
        f"{transformer_where}: vae_scale_factors {list(declared)}, but the video VAE ({where}) compresses "
        f"{[temporal, spatial, spatial]}: expected the VAE's factors (the transformer's RoPE grid is in its pixels)"
    )
