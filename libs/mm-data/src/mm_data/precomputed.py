"""Per-sample precomputed latents / text embeddings files: one ``.safetensors`` (or torch) file per sample.

A safetensors file holds tensors (``latents``, ``prompt_embeds``, ``prompt_attention_mask``, optional
``audio_latents``, ``first_frame_latents``, ...) and, in its metadata header, one JSON string per
metadata key (e.g. ``{"prompt": "\\"a red square\\"", "index": "3"}``). A torch file (``.pt``/``.pth``)
is a dict of tensors with an optional ``"metadata"`` dict.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

__all__ = ["save_precomputed", "load_precomputed", "REQUIRED_KEYS", "PRECOMPUTED_EXTENSIONS"]

REQUIRED_KEYS = ("latents", "prompt_embeds", "prompt_attention_mask")
PRECOMPUTED_EXTENSIONS = (".safetensors", ".pt", ".pth")
"""File suffixes of per-sample files."""


def save_precomputed(
    path: str | Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, Any]
) -> None:
    """Write one sample atomically (temporary file in the same folder, then rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    data = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    if path.suffix == ".safetensors":
        save_file(data, str(tmp), metadata={k: json.dumps(v) for k, v in metadata.items()})
    else:
        torch.save({**data, "metadata": dict(metadata)}, tmp)
    os.replace(tmp, path)


def load_precomputed(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read one sample: (tensors, metadata)."""
    path = Path(path)
    if path.suffix == ".safetensors":
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
        metadata = {}
        for key, value in header.items():
            try:
                metadata[key] = json.loads(value)
            except json.JSONDecodeError:
                metadata[key] = value  # written by another tool: keep the raw string
        return load_file(str(path)), metadata
    data = torch.load(path, map_location="cpu", weights_only=True)
    metadata = dict(data.pop("metadata", {}) or {})
    return {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}, metadata
