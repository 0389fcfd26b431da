"""The ``ltx2_precomputed`` dataset id: the cache written by ``ltx2-train preprocess``, read at train time.

One YAML drives both steps: ``data.data_path`` is the cache folder, ``data.dataset.preprocess``
says where the clips and the frozen encoders are (only ``ltx2-train preprocess`` reads it).
"""

from __future__ import annotations

from typing import Any

from mm_config import register_dataset_schema
from mm_data import PrecomputedLatentDataset
from mm_trainer import data_register
from pydantic import BaseModel, ConfigDict, Field


class PreprocessOptions(BaseModel):
    """``data.dataset.preprocess``: what ``ltx2-train preprocess`` encodes into ``data.data_path``."""

    model_config = ConfigDict(extra="forbid")

    source: str
    """Clip metadata file (``mm_data.VideoTextDataset`` layout: path, cap, fps, ...)."""
    source_root: str | None = None
    """Directory that relative clip paths are resolved against."""
    model_root: str
    """LTX-2 diffusers folder with ``vae/``, ``audio_vae/``, ``text_encoder/``, ``tokenizer/``, ``connectors/``."""
    num_frames: int = Field(default=121, ge=1)
    """Frames per clip (8k+1 for LTX-2's x8 temporal VAE)."""
    height: int = Field(default=512, ge=1)
    """Frame height in pixels (multiple of the VAE's spatial factor)."""
    width: int = Field(default=768, ge=1)
    """Frame width in pixels."""
    fps: float | None = None
    """Resample clips to this frame rate; None keeps each clip's own rate."""
    frame_rule: str | None = None
    """Frame-count rule checked by the clip reader (e.g. ``8k+1``); None = any."""
    max_sequence_length: int = Field(default=1024, ge=1)
    """Text tokens (padded, left) fed to Gemma-3."""
    audio: bool = True
    """Encode audio latents too (a synthetic tone for clips without an audio track)."""
    dtype: str = "fp32"
    """Encoder compute dtype (fp32 | bf16 | fp16); cached tensors keep it."""
    device: str | None = None
    """Encoder device; None = cuda/npu of this rank when present, else cpu."""


class LTX2PrecomputedSchema(BaseModel):
    """``data.dataset`` of ``ltx2_precomputed``."""

    model_config = ConfigDict(extra="forbid")

    preprocess: PreprocessOptions | None = None
    """Inputs of ``ltx2-train preprocess``; ignored by training."""


register_dataset_schema("ltx2_precomputed", LTX2PrecomputedSchema)


@data_register("ltx2_precomputed")
def ltx2_precomputed_dataset(
    *, data_path: str, data_root: str | None = None, preprocess: dict[str, Any] | None = None
) -> PrecomputedLatentDataset:
    """``PrecomputedLatentDataset`` over the cache folder ``data.data_path``."""
    return PrecomputedLatentDataset(data_path)
