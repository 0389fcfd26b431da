"""`WanDiT` weights on disk: load a diffusers or native Wan folder, save one in either layout.

The model file (`wan_dit.py`) holds the network only; this module is its I/O. Keys go through
mm-checkpoint's `wan2_2` key map (`wan22_train.key_maps`): diffusers keys are renamed to the native
layout on load and back on a diffusers save. The trainer's path is `WanPredictor.from_pretrained(args)`
(a config section, weights through mm-checkpoint); these two functions are for a `WanDiT` alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import torch
from mm_checkpoint import load_checkpoint_with_conversion
from safetensors.torch import save_file

from ..key_maps import native_to_diffusers
from .config import WanDiTConfig
from .wan_dit import WanDiT

Layout = Literal["native", "diffusers"]
#: The safetensors file name of each layout: the official Wan release names its DiT weights as diffusers
#: does (the official ``WanModel`` is a diffusers ``ModelMixin``).
WEIGHTS_NAMES: dict[str, str] = {
    "native": "diffusion_pytorch_model.safetensors",
    "diffusers": "diffusion_pytorch_model.safetensors",
}


def load_wan_dit(
    path: str | Path, *, dtype: torch.dtype | None = None, device: torch.device | str = "cpu"
) -> WanDiT:
    """A `WanDiT` from a diffusers `WanTransformer3DModel` folder or a native Wan folder
    (config.json + safetensors): built on meta, materialized on `device`, every parameter loaded
    with its shape (strict), then cast to `dtype` if given."""
    config = WanDiTConfig.from_file(Path(path) / "config.json")
    with torch.device("meta"):
        model = WanDiT(config)
    model.to_empty(device=device)
    load_checkpoint_with_conversion(model, path, model_type="wan2_2", strict=True)
    return model.to(dtype) if dtype is not None else model


def save_wan_dit(model: WanDiT, path: str | Path, *, layout: Layout = "native") -> None:
    """Write config.json + one safetensors file in the `native` or `diffusers` layout (the latter loads
    with diffusers' `WanTransformer3DModel.from_pretrained`)."""
    if layout not in WEIGHTS_NAMES:
        raise ValueError(f"layout={layout!r}: expected one of {list(WEIGHTS_NAMES)}")
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if layout == "diffusers":
        config, state = model.config.to_diffusers(), native_to_diffusers(state)
    else:
        config = model.config.to_native()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(state, str(path / WEIGHTS_NAMES[layout]))
