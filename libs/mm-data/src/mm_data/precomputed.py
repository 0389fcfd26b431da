"""Per-sample precomputed latents / text embeddings: one ``.safetensors`` (or torch) file per sample.

A safetensors file holds tensors (``latents``, ``prompt_embeds``, ``prompt_attention_mask``, optional
``audio_latents``, ``first_frame_latents``, ...) and, in its metadata header, one JSON string per
metadata key (e.g. ``{"prompt": "\\"a red square\\"", "index": "3"}``). A torch file (``.pt``/``.pth``)
is a dict of tensors with an optional ``"metadata"`` dict.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch.utils.data import Dataset

__all__ = ["PrecomputedLatentDataset", "save_precomputed", "load_precomputed", "REQUIRED_KEYS"]

REQUIRED_KEYS = ("latents", "prompt_embeds", "prompt_attention_mask")
_EXTENSIONS = (".safetensors", ".pt", ".pth")


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


def _latents_shape(path: Path) -> tuple[int, ...] | None:
    if path.suffix != ".safetensors":
        return None
    with safe_open(str(path), framework="pt") as f:
        return tuple(f.get_slice("latents").get_shape()) if "latents" in f.keys() else None


class PrecomputedLatentDataset(Dataset):
    """Samples cached by :func:`mm_data.cache_dataset` (or any tool writing the same layout).

    Items: every stored tensor, ``metadata`` (dict), ``prompt`` (from metadata, ``""`` if absent),
    ``index`` and ``bucket`` (samples whose ``latents`` have the same shape share a bucket, so the
    :class:`GlobalOrderSampler` never mixes shapes in a batch).
    """

    def __init__(self, root: str | Path, *, required: Sequence[str] = REQUIRED_KEYS) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"precomputed dataset folder not found: {self.root}")
        self.files = sorted(
            p for p in self.root.iterdir() if p.suffix in _EXTENSIONS and not p.name.startswith(".")
        )
        if not self.files:
            raise ValueError(f"{self.root}: no {'/'.join(_EXTENSIONS)} files")
        self.required = tuple(required)
        shapes = [_latents_shape(p) for p in self.files]
        ids: dict[Any, int] = {}
        self.bucket_ids = [ids.setdefault(s, len(ids)) for s in shapes]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> dict[str, Any]:
        path = self.files[int(index)]
        tensors, metadata = load_precomputed(path)
        missing = [k for k in self.required if k not in tensors]
        if missing:
            raise KeyError(f"{path}: missing tensors {missing}; has {sorted(tensors)}")
        return {
            **tensors,
            "prompt": metadata.get("prompt", ""),
            "metadata": metadata,
            "index": int(index),
            "bucket": self.bucket_ids[int(index)],
        }
