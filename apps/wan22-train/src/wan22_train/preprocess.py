"""``wan22-train preprocess``: clips -> per-sample VAE latents and UMT5 embeddings (``wan22_cached``).

Runs the frozen encoders once, before training, so that neither is resident while the predictor
trains (UMT5-XXL alone is ~11 GB in bf16). The encoders are the sub-models an online run would build
(``ae``: ``WanVideoVAE``, ``text_encoder``: ``UMT5TextEncoder``, from the same config keys) and they
are called through the run's own ``Wan22Pipeline`` stages (``encode_latents``, ``encode_image_latents``,
``encode_prompt``), so a cached sample is what online encoding computes:

- ``latents [C, T, h, w]``: the VAE posterior's mode, normalized (deterministic: nothing is sampled);
- ``image_latents [C, T, h, w]`` (``task: i2v`` only): the VAE on the first-frame-only clip
  (``ti2v`` takes its clean first frame from ``latents``; nothing extra is cached);
- ``prompt_embeds.<j> [tokens_j, D]``: UMT5 on every distinct caption of the row and on the empty
  prompt, real tokens only (``mm_data.caption_entries``); the caption is drawn at train time.

Sharded across ranks (rank ``r`` of ``W`` writes indices ``r::W``, under ``torchrun`` or alone) and
resumable (complete files are skipped): both from :func:`mm_data.cache_dataset`, as for LTX-2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from mm_config import TrainConfig
from mm_data import CacheReport, VideoTextDataset, cache_dataset, caption_candidates, caption_entries
from mm_parallel import get_local_device
from mm_trainer import ModelHub, preprocess_section

from wan22_train.config_schema import WanPreprocessOptions
from wan22_train.pipeline import Wan22Pipeline


@dataclass
class WanEncoders:
    """The frozen encoders as a pipeline container (sub-models ``ae`` and ``text_encoder``), on ``device``."""

    ae: torch.nn.Module
    text_encoder: torch.nn.Module
    device: torch.device

    @classmethod
    def load(cls, options: WanPreprocessOptions, device: torch.device) -> WanEncoders:
        """Build both with :class:`mm_trainer.ModelHub` (real weights, never meta), frozen, on ``device``."""

        def frozen(args: Any) -> torch.nn.Module:
            model = ModelHub.build(args, meta_init=False)
            return model.to(device).eval().requires_grad_(False)

        return cls(frozen(options.ae), frozen(options.text_encoder), device)


@torch.no_grad()
def encode_sample(
    pipeline: Wan22Pipeline, encoders: WanEncoders, item: dict[str, Any], caption: str | list[str]
) -> dict[str, Any]:
    """Everything one cached sample holds, for a ``VideoTextDataset`` item and its row's ``caption``."""
    batch = {"video": item["video"][None].to(encoders.device)}
    out: dict[str, Any] = {"latents": pipeline.encode_latents(encoders, batch)[0]}
    if pipeline.task == "i2v":
        out["image_latents"] = pipeline.encode_image_latents(encoders, batch)[0]
    tokens = encoders.text_encoder.tokenize(caption_candidates(caption), encoders.device)
    embeds = pipeline.encode_prompt(encoders, tokens)  # [K, text_len, D], zero beyond each prompt
    lengths = tokens["attention_mask"].sum(dim=1).tolist()
    if any(tokens["attention_mask"][k, : int(n)].min() < 1 for k, n in enumerate(lengths) if n):
        raise ValueError(
            "the UMT5 tokenizer must pad on the right (the cache keeps each prompt's leading tokens)"
        )
    out.update(caption_entries(caption, [e[: int(n)] for e, n in zip(embeds, lengths)], embeds.shape[1]))
    return {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in out.items()}


def preprocess_options(config: TrainConfig) -> WanPreprocessOptions:
    """``data.dataset.preprocess`` of a ``wan22_cached`` config, validated."""
    return preprocess_section(
        config, dataset_id="wan22_cached", schema=WanPreprocessOptions, tool="wan22-train preprocess"
    )


def source_dataset(options: WanPreprocessOptions) -> VideoTextDataset:
    """The clips to encode, read as a ``video_text`` run reads them (buckets included)."""
    clips = options.clips.model_dump(exclude_unset=True)
    return VideoTextDataset(options.source, data_root=options.source_root, **clips)


def run_preprocess(
    config: TrainConfig, *, rank: int | None = None, world_size: int | None = None
) -> CacheReport:
    """Encode this rank's share of the clips into ``data.data_path`` (rank/world from ``torchrun``'s env)."""
    options = preprocess_options(config)
    device = torch.device(options.device) if options.device else get_local_device()
    encoders = WanEncoders.load(options, device)
    pipeline = Wan22Pipeline.from_options(config.model.pipeline or {})
    dataset = source_dataset(options)

    def encode(item: dict[str, Any]) -> dict[str, Any]:
        return encode_sample(pipeline, encoders, item, dataset.rows[int(item["index"])]["caption"])

    return cache_dataset(dataset, encode, config.data.data_path, rank=rank, world_size=world_size)
