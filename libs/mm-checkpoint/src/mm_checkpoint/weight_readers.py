"""One opener for every non-DCP weights source: safetensors (a file, or a folder with or without an
index), a ComfyUI single file (:mod:`.comfy_files`) and a ``torch.save`` state dict (:mod:`.pth_io`).

Loading, online conversion, ``mm-ckpt`` and merged-LoRA export read through :func:`open_weights`, so a
source is read the same way wherever it is named; every reader has ``keys``, ``info``, ``read(key,
index)`` and ``close``.
"""

from __future__ import annotations

import os
from pathlib import Path

from .comfy_files import ComfyFileView, open_comfy_aware
from .formats import is_pth_file
from .pth_io import PthReader
from .safetensors_io import SafetensorsReader

WeightsReader = SafetensorsReader | ComfyFileView | PthReader
"""What :func:`open_weights` returns."""


def open_weights(path: str | os.PathLike, *, zero_copy: bool = False, raw: bool = False) -> WeightsReader:
    """A reader over the weights at ``path``: :class:`PthReader` for a ``.pth`` / ``.pt`` file, else a
    :class:`SafetensorsReader`, seen through :class:`ComfyFileView` when it is a ComfyUI single file
    (``raw=True``: the file's tensors as stored, e.g. for ``mm-ckpt inspect``)."""
    if is_pth_file(path):
        return PthReader(path, zero_copy=zero_copy)
    if raw:
        return SafetensorsReader(path, zero_copy=zero_copy)
    return open_comfy_aware(Path(path), zero_copy=zero_copy)
