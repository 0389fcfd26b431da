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

The cache is :func:`mm_data.cache_dataset`'s (through :func:`mm_trainer.write_latent_cache`, as for
LTX-2): sharded, keyed by each clip's content, the row, the reading parameters and the encoders' identity
(their weights' digests, dtypes, the task, ``ENCODE_VERSION``), so a re-run encodes only what changed
and resumes an interrupted run; it records the ``data.dataset.preprocess`` keys it was made with, which a
training run's own section must match (``mm_trainer.check_cache_made_as_configured``). Under ``torchrun`` the ranks split the clips; UMT5 is sharded over them
with FSDP2 when ``run.text_encoder_fsdp`` says so (docs/DESIGN.md "Latent cache").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from mm_config import TrainConfig
from mm_data import CacheReport, VideoTextDataset, caption_candidates, caption_entries
from mm_trainer import (
    ModelHub,
    enable_vae_tiling,
    load_frozen,
    preprocess_ranks,
    preprocess_recipe,
    preprocess_section,
    use_text_encoder_fsdp,
    weights_identity,
    write_latent_cache,
)

from wan22_train.config_schema import WanPreprocessOptions
from wan22_train.pipeline import Wan22Pipeline

ENCODE_VERSION = 1
"""Bumped when what this module caches per sample changes (it is part of every sample's key)."""
UMT5_BLOCKS = "encoder.block.{*}"
"""The FSDP units of a sharded UMT5 (one per encoder block, plus the root)."""


@dataclass
class WanEncoders:
    """The frozen encoders as a pipeline container (sub-models ``ae`` and ``text_encoder``), on ``device``.
    ``sharded``: UMT5 is FSDP-sharded over the ranks (every rank must call it equally often)."""

    ae: torch.nn.Module
    text_encoder: torch.nn.Module
    device: torch.device
    sharded: bool = False

    @classmethod
    def load(cls, options: WanPreprocessOptions, device: torch.device, *, world_size: int = 1) -> WanEncoders:
        """The VAE with :class:`mm_trainer.ModelHub` (real weights), UMT5 built on meta in its dtype and
        loaded once per rank (:func:`mm_trainer.load_frozen`), sharded when ``run.text_encoder_fsdp`` says
        so; the VAE tiled with ``run.vae_tiling``."""
        run = options.run
        ae = ModelHub.build(options.ae, meta_init=False).to(device).eval().requires_grad_(False)
        if run.vae_tiling:
            enable_vae_tiling(ae.vae, run.vae_tile)
        weights = options.text_encoder.from_pretrained
        sharded = use_text_encoder_fsdp(run.text_encoder_fsdp, weights=weights, world_size=world_size)
        text_encoder = load_frozen(options.text_encoder, device=device, what="data.dataset.preprocess.text_encoder",
                                   shard_blocks=UMT5_BLOCKS if sharded else None)  # fmt: skip
        return cls(ae, text_encoder, device, sharded)

    def identity(self, options: WanPreprocessOptions, out_dir: str, task: str) -> dict[str, Any]:
        """What the cached tensors depend on besides the sample: both encoders' sections and weights, the
        tokenizer, the task."""
        tokenizer = (options.text_encoder.config or {}).get("tokenizer")
        return {
            "encoder": "wan22-train preprocess", "version": ENCODE_VERSION, "task": task,
            "ae": options.ae.model_dump(mode="json"), "text_encoder": options.text_encoder.model_dump(mode="json"),
            "weights": weights_identity(out_dir, {"ae": options.ae.from_pretrained,
                                                  "text_encoder": options.text_encoder.from_pretrained,
                                                  "tokenizer": tokenizer}),
        }  # fmt: skip


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


@torch.no_grad()
def idle_text_encoder(pipeline: Wan22Pipeline, encoders: WanEncoders) -> None:
    """One UMT5 forward on the empty prompt, discarded: what a rank without a clip to encode runs while the
    others encode, when UMT5 is sharded over them."""
    pipeline.encode_prompt(encoders, encoders.text_encoder.tokenize([""], encoders.device))


def source_dataset(options: WanPreprocessOptions) -> VideoTextDataset:
    """The clips to encode, read as a ``video_text`` run reads them (buckets included)."""
    clips = options.clips.model_dump(exclude_unset=True)
    return VideoTextDataset(options.source, data_root=options.source_root, **clips)


def run_preprocess(
    config: TrainConfig, *, rank: int | None = None, world_size: int | None = None
) -> CacheReport:
    """Encode what ``data.data_path`` does not hold yet; under ``torchrun`` the ranks split the clips.
    ``rank`` / ``world_size`` default to (and must agree with) torchrun's."""
    options = preprocess_options(config)
    device, env_rank, env_world = preprocess_ranks(options.device)
    if (rank, world_size) not in ((None, None), (env_rank, env_world)):
        raise ValueError(
            f"rank={rank}, world_size={world_size}: this process is rank {env_rank} of {env_world}"
        )
    dataset = source_dataset(options)  # first: a bad source fails before any model loads
    encoders = WanEncoders.load(options, device, world_size=env_world)
    pipeline = Wan22Pipeline.from_options(config.model.pipeline or {})
    out = str(config.data.data_path)

    def encode(item: dict[str, Any]) -> dict[str, Any]:
        return encode_sample(pipeline, encoders, item, dataset.rows[int(item["index"])]["caption"])

    return write_latent_cache(
        dataset, encode, out, run=options.run, identity=encoders.identity(options, out, pipeline.task),
        uses_prompt=False, idle=(lambda: idle_text_encoder(pipeline, encoders)) if encoders.sharded else None,
        recipe=preprocess_recipe(options),
    )  # fmt: skip
