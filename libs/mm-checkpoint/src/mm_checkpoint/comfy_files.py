"""ComfyUI's single-file checkpoints (the Comfy-Org "repackaged" files, fp8 "scaled" ones included)
seen as plain weights.

What such a file may hold besides the model's own tensors, and what :class:`ComfyFileView` makes of it
(read from ComfyUI's ``comfy/utils.py`` / ``comfy/model_detection.py``, 2026-12):

- every key under ``model.diffusion_model.`` (ComfyUI's checkpoint prefix for the diffusion model):
  the prefix comes off when every tensor has it (the marker and the tokenizer blob below aside). A file
  where some tensors have it and others do not (a checkpoint bundling a VAE or text encoder, or a few
  stray tensors) is refused naming the tensors outside the file's layout, instead of a load that
  reports every one of the model's keys missing;
- fp8 "scaled" weights: a marker tensor ``<prefix>scaled_fp8`` says the file is scaled; each scaled
  layer stores its ``weight`` in float8 and a ``<layer>.scale_weight``; the real weight is
  ``weight.to(float32) * scale_weight`` (what ComfyUI computes before its matmul). The view returns
  that product in float32 under the weight's name and hides the marker, the ``scale_weight`` and the
  ``scale_input`` tensors (an activation scale for fp8 matmuls, no weight);
- ``spiece_model``: the sentencepiece tokenizer as bytes, which ComfyUI's text-encoder files may
  carry; hidden (the tokenizer is read from the tokenizer folder).
- the components an official LTX-2 release file bundles beside its diffusion model (:data:`BUNDLED_COMPONENTS`:
  ``vae.``, ``audio_vae.``, ``vocoder.``, the text connectors' ``text_embedding_projection.``; the prefixes
  diffusers' LTX-2 converters read); hidden: the diffusion model's weights are what the view shows, each
  other component is read by its own loader.

ComfyUI's newer per-layer format (``<layer>.comfy_quant`` tensors, ``_quantization_metadata``) is
refused with a message. The key names left are the model's own: official native Wan names for the
DiT and the VAE, transformers' T5 names for UMT5, which the key maps of :mod:`.model_key_maps` read.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from .errors import CheckpointFormatError
from .safetensors_io import SafetensorsReader, StoredTensor, TensorInfo

DIFFUSION_MODEL_PREFIX = "model.diffusion_model."
"""ComfyUI's prefix for the diffusion model's keys in a checkpoint file."""
SCALED_FP8_MARKER = "scaled_fp8"
SCALE_WEIGHT, SCALE_INPUT = ".scale_weight", ".scale_input"
HIDDEN_KEYS = ("spiece_model",)
"""Non-weight entries a ComfyUI file may hold, hidden from the weights."""
BUNDLED_COMPONENTS = ("vae.", "audio_vae.", "vocoder.", "text_embedding_projection.")
"""Prefixes of the components an LTX-2 release file holds beside ``model.diffusion_model.`` (module docstring)."""


def is_comfy_file(reader: SafetensorsReader) -> bool:
    """True when ``reader``'s keys follow one of ComfyUI's single-file conventions (module docstring)."""
    keys = reader.keys()
    if any(k.endswith(".comfy_quant") for k in keys):
        raise CheckpointFormatError(
            f"{reader.path} uses ComfyUI's per-layer quantization format (.comfy_quant tensors), which "
            "mm-checkpoint does not read; use the file's bf16 / fp16 or fp8_scaled release"
        )
    marked = any(k == SCALED_FP8_MARKER or k.endswith("." + SCALED_FP8_MARKER) for k in keys)
    prefixed = bool(comfy_prefix(keys, reader.path))
    return marked or prefixed or any(k in HIDDEN_KEYS for k in keys)


def comfy_prefix(keys: Sequence[str], path: object) -> str:
    """ComfyUI's diffusion-model prefix when every tensor of ``keys`` has it (the top-level fp8 marker and
    the tokenizer blob aside), else ``""``; a file where some tensors have it and others do not is refused
    (:class:`CheckpointFormatError`) naming the ones outside the file's layout."""
    tensors = [k for k in keys if k not in HIDDEN_KEYS and k != SCALED_FP8_MARKER]
    under = [k for k in tensors if k.startswith(DIFFUSION_MODEL_PREFIX)]
    if not under:
        return ""
    tensors = [k for k in tensors if not k.startswith(BUNDLED_COMPONENTS)]
    if len(under) == len(tensors):
        return DIFFUSION_MODEL_PREFIX
    outside = [k for k in tensors if not k.startswith(DIFFUSION_MODEL_PREFIX)]
    foreign, where = (outside, "outside it") if len(under) >= len(outside) else (under, "under it")
    shown = ", ".join(foreign[:10]) + (f" and {len(foreign) - 10} more" if len(foreign) > 10 else "")
    raise CheckpointFormatError(
        f"{path}: {len(under)} of {len(tensors)} tensors are under ComfyUI's diffusion-model prefix "
        f"`{DIFFUSION_MODEL_PREFIX}` and {len(outside)} are not; these {len(foreign)} are {where}: {shown}. A "
        "ComfyUI single file of one model has every tensor under that prefix (a checkpoint) or none (a "
        "repackaged split file); a file that bundles other models (a VAE's `first_stage_model.`, text "
        "encoders' `cond_stage_model.` / `text_encoders.`) or stray tensors is not one model's weights: use "
        "the model's own file, or save it without these tensors"
    )


class ComfyFileView:
    """A :class:`SafetensorsReader` over a ComfyUI single file, showing the model's own weights: the
    ``model.diffusion_model.`` prefix removed, scaled fp8 weights upcast with their scales (float32),
    markers, scales and the tokenizer blob hidden. Same interface as the reader it wraps."""

    def __init__(self, reader: SafetensorsReader) -> None:
        self.reader = reader
        self.path = reader.path
        raw = reader.keys()
        self.prefix = comfy_prefix(raw, reader.path)
        hidden = {
            k
            for k in raw
            if k.endswith(SCALED_FP8_MARKER) and k.removesuffix(SCALED_FP8_MARKER) in ("", self.prefix)
        }
        hidden |= {k for k in raw if k.endswith((SCALE_WEIGHT, SCALE_INPUT)) or k in HIDDEN_KEYS}
        if self.prefix:
            hidden |= {k for k in raw if k.startswith(BUNDLED_COMPONENTS)}
        self._raw = {k.removeprefix(self.prefix): k for k in raw if k not in hidden}
        self._scales = {
            name: scale
            for name, key in self._raw.items()
            if name.endswith(".weight") and (scale := key.removesuffix(".weight") + SCALE_WEIGHT) in reader
        }

    def __enter__(self) -> ComfyFileView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.reader.close()

    def keys(self) -> list[str]:
        return list(self._raw)

    def __contains__(self, key: str) -> bool:
        return key in self._raw

    def _key(self, key: str) -> str:
        try:
            return self._raw[key]
        except KeyError:
            raise KeyError(f"tensor {key!r} not found in ComfyUI file {self.path}") from None

    def info(self, key: str) -> TensorInfo:
        info = self.reader.info(self._key(key))
        return TensorInfo(info.shape, torch.float32) if key in self._scales else info

    def stored(self, key: str) -> StoredTensor:
        return self.reader.stored(self._key(key))

    def read(self, key: str, index: Sequence[slice] | None = None) -> torch.Tensor:
        """Tensor ``key`` (or ``tensor[index]``); a scaled fp8 weight comes back as ``float32 * scale``."""
        value = self.reader.read(self._key(key), index)
        if key not in self._scales:
            return value
        scale = self.reader.read(self._scales[key]).float()
        if scale.numel() != 1:
            if scale.shape[0] != self.reader.info(self._key(key)).shape[0] or scale.numel() != scale.shape[0]:
                raise CheckpointFormatError(
                    f"{self.path}: {self._scales[key]} has shape {tuple(scale.shape)}; expected one scale "
                    "per tensor or per output row"
                )
            rows = index[0] if index else slice(None)
            scale = scale.reshape(-1)[rows].reshape(-1, *([1] * (value.dim() - 1)))
        return value.float() * scale


def open_comfy_aware(path: str | Path, *, zero_copy: bool = False) -> SafetensorsReader | ComfyFileView:
    """A safetensors reader over ``path``, seen through :class:`ComfyFileView` when it is a ComfyUI file."""
    reader = SafetensorsReader(path, zero_copy=zero_copy)
    return ComfyFileView(reader) if is_comfy_file(reader) else reader
