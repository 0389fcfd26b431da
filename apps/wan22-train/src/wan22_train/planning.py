"""A micro-batch of a Wan2.2 run's real shapes, for ``mm-train plan`` (the container's ``planning_batch``).

Online (``video_text``): what the dataset and its collate yield, ``video [B, 3, F, H, W]`` float32 in
[-1, 1] at the largest bucket (the memory's worst case), and the prompt already tokenized
(``input_ids`` / ``attention_mask [B, text_len]``: the pipeline skips its tokenizer, which a plan
of placeholder paths does not have). From the encoder cache (``wan22_cached``): ``latents [B, z, T,
h, w]`` float32 (z = the predictor's ``out_dim``; T, h, w from the clip size and the VAE's
compression in the ``preprocess.ae`` config, Wan's 4 x 8 x 8 by default) and ``prompt_embeds [B,
text_len, text_dim]`` in the text encoder's dtype; I2V adds ``image_latents``. A Diffusion-DPO run's pairs
add the rejected member's clip (``rejected_video``). A packed run (``data.packing``, t2v, online): the
packed micro-batch the planner asks for (``pack``: clips per bucket shape), one ``video [3, F, H, W]``
per sample in a list, as the packed loader collates them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from mm_data import parse_buckets
from mm_parallel import parse_dtype
from mm_pipelines import REJECTED_PREFIX, DiffusionDPO

CACHED_DATASET = "wan22_cached"
CLIP_KEYS = ("video", "latents", "image_latents")
"""A sample's own keys (the rest, the prompt, a Diffusion-DPO pair's members share)."""


def clip_shapes(options: dict[str, Any]) -> list[tuple[int, int, int]]:
    """``(frames, height, width)`` of every bucket of a ``video_text`` section (one without buckets: its clip)."""
    frames, height, width = int(options["num_frames"]), int(options["height"]), int(options["width"])
    buckets = options.get("buckets")
    if buckets is None:
        return [(frames, height, width)]
    return list(dict.fromkeys((b.num_frames, b.height, b.width) for b in parse_buckets(buckets, frames)))


def largest_clip(options: dict[str, Any]) -> tuple[int, int, int]:
    """``(frames, height, width)`` of the largest bucket of a ``video_text`` section (by pixels)."""
    return max(clip_shapes(options), key=lambda s: s[0] * s[1] * s[2])


def latent_grid(clip: tuple[int, int, int], temporal: int, spatial: int) -> tuple[int, int, int]:
    """The VAE's latent ``(T, h, w)`` of a clip ``(frames, height, width)`` (causal: 1 + (F - 1) / t)."""
    frames, height, width = clip
    return 1 + (frames - 1) // temporal, height // spatial, width // spatial


def online_batch(container: Any, options: dict[str, Any], size: int) -> dict[str, Any]:
    """``video`` + tokenized prompt, as ``video_text`` yields them."""
    return {"video": torch.zeros(size, 3, *largest_clip(options)), **_prompt_ids(container, size)}


def packed_batch(container: Any, pack: Mapping[tuple[int, int, int], int]) -> dict[str, Any]:
    """A packed micro-batch (``data.packing``) of ``pack[shape]`` clips of each ``(frames, height, width)``,
    as the packed loader collates it (``mm_data.collate_packed``): one ``video [3, F, H, W]`` per sample
    in a list; the prompts tokenized to ``[N, text_len]``, as the pipeline tokenizes the samples' prompts."""
    videos = [torch.zeros(3, *shape) for shape, count in pack.items() for _ in range(count)]
    return {"video": videos, **_prompt_ids(container, len(videos))}


def _prompt_ids(container: Any, size: int) -> dict[str, torch.Tensor]:
    text_len = int(getattr(container.text_encoder, "text_len", 512))
    return {
        "input_ids": torch.ones(size, text_len, dtype=torch.long),
        "attention_mask": torch.ones(size, text_len, dtype=torch.long),
    }


def cached_batch(container: Any, options: dict[str, Any], size: int) -> dict[str, Any]:
    """``latents`` + ``prompt_embeds`` (+ ``image_latents``), as the encoder cache yields them."""
    preprocess = options.get("preprocess") or {}
    ae_config = (preprocess.get("ae") or {}).get("config") or {}
    encoder = preprocess.get("text_encoder") or {}
    config = container.predictor.config
    grid = latent_grid(
        largest_clip(preprocess.get("clips") or {}),
        int(ae_config.get("scale_factor_temporal", 4)),
        int(ae_config.get("scale_factor_spatial", 8)),
    )
    dtype = (
        parse_dtype(encoder.get("dtype"), key="data.dataset.preprocess.text_encoder.dtype") or torch.float32
    )
    batch = {
        "latents": torch.zeros(size, config.out_dim, *grid),
        "prompt_embeds": torch.zeros(size, config.text_len, config.text_dim, dtype=dtype),
    }
    if container.flow_pipeline.task == "i2v":
        batch["image_latents"] = torch.zeros(size, config.out_dim, *grid)
    return batch


def planning_batch(
    container: Any, data: Any, micro_batch_size: int, pack: Mapping[tuple[int, int, int], int] | None = None
) -> dict[str, Any]:
    """One micro-batch of ``data``'s real shapes with ``sample_ids`` (see the module docstring); with
    ``pack`` (``data.packing``: clips per shape, the container's ``packing_shapes``) a packed one."""
    options = dict(data.dataset or {})
    if pack is not None:
        batch = packed_batch(container, pack)
        batch["sample_ids"] = list(range(len(batch["video"])))
        return batch
    if data.dataset_id == CACHED_DATASET:
        batch = cached_batch(container, options, micro_batch_size)
    else:
        batch = online_batch(container, options, micro_batch_size)
    if isinstance(
        container.pipeline, DiffusionDPO
    ):  # pairs: the rejected member's clip beside the preferred one
        batch |= {f"{REJECTED_PREFIX}{k}": torch.zeros_like(batch[k]) for k in CLIP_KEYS if k in batch}
    batch["sample_ids"] = list(range(micro_batch_size))
    return batch
