"""Validation clips of an LTX-2 run (``training.validation.prompts``), with their audio.

LTX-2 trains on the cache ``ltx2-train preprocess`` wrote, so nothing of Gemma-3 or the VAEs is built with
the run. Before training (:func:`prepare_sampling`, through the container's ``prepare_sampling`` hook) every
rank loads the frozen encoders the cache was written with (``data.dataset.preprocess``: ``model_root``, its
``dtype``, Gemma-3 sharded over the ranks as ``run.text_encoder_fsdp`` says) on the training device,
encodes every prompt (and, with guidance, the negative prompt) once, and releases Gemma-3 and the
connectors: the VAEs stay to decode. Each clip is then :func:`ltx2_train.sampling.sample_clip`, on every
rank alike (the transformer's FSDP shards gather in each forward, the sequence-parallel ranks split its
tokens), from noise drawn on the CPU from the prompt's seed alone: the same clip at any layout. Its audio
is the decoded log-mel's Griffin-Lim waveform, as ``ltx2-train sample`` writes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from mm_parallel import parse_dtype
from mm_pipelines import DistributionMatchingDistillation
from mm_trainer import SampledClip, use_text_encoder_fsdp

from ltx2_train.pipeline import LTX2Pipeline, check_patch_grid, video_patch
from ltx2_train.preprocess import LTX2Encoders, preprocess_options
from ltx2_train.sampling import latent_grid, sample_clip, waveform

__all__ = ["SamplingSet", "prepare_sampling", "sample_validation_clip"]


@dataclass
class SamplingSet:
    """What validation samples with: the VAEs (the text side released) and each prompt's embeddings."""

    encoders: LTX2Encoders
    texts: dict[str, dict[str, torch.Tensor]]
    text_len: int


def prepare_sampling(
    validation: Any, *, data: Any, device: torch.device, model: torch.nn.Module, audio: bool, distilled: bool
) -> SamplingSet:
    """Load the cache's encoders on ``device`` (the audio VAE with ``audio``), encode the prompts once, keep
    the VAEs (module docstring); ``model`` is the transformer whose patches the clips' latents must tile,
    ``distilled`` a distillation's student (sampled without guidance).

    Raises:
        ValueError: the run has no ``data.dataset.preprocess`` (where the encoders are), or the clip size
            does not fit the VAE's compression or the transformer's patches (before training starts).
    """
    try:
        options = preprocess_options(data)
    except ValueError as e:
        raise ValueError(
            f"training.validation.prompts: LTX-2 samples its clips with the encoders the cache was written "
            f"with, named by data.dataset.preprocess ({e})"
        ) from None
    dtype = parse_dtype(options.dtype, key="data.dataset.preprocess.dtype") or torch.float32
    world = dist.get_world_size() if dist.is_initialized() else 1
    shard = use_text_encoder_fsdp(options.run.text_encoder_fsdp, weights=Path(options.model_root) / "text_encoder",
                                  world_size=world)  # fmt: skip
    encoders = LTX2Encoders.load(options.model_root, audio=audio, device=device, dtype=dtype,
                                 shard_text_encoder=shard)  # fmt: skip
    grid = latent_grid(encoders, validation.num_frames, validation.height, validation.width)
    check_patch_grid(grid, *video_patch(model))
    if validation.audio_guidance_scale is not None and not audio:
        raise ValueError(
            "training.validation.audio_guidance_scale: this run samples no audio (model.pipeline.audio: false); "
            "leave it out"
        )
    prompts = list(validation.prompts)
    if {validation.guidance_scale, validation.audio_guidance_scale} - {1.0, None} and not distilled:
        prompts.append(validation.negative_prompt)
    length = options.max_sequence_length
    texts = {prompt: encoders.encode_text(prompt, length) for prompt in dict.fromkeys(prompts)}
    encoders.release_text_side()
    return SamplingSet(encoders, texts, length)


def sample_validation_clip(
    holder: torch.nn.Module,
    pipeline: LTX2Pipeline | DistributionMatchingDistillation,
    sampling: SamplingSet,
    prompt: str,
    *,
    seed: int,
    num_frames: int,
    height: int,
    width: int,
    steps: int,
    guidance_scale: float,
    negative_prompt: str,
    shift: float | None,
    fps: int,
    audio_guidance_scale: float | None = None,
) -> SampledClip:
    """One validation clip of ``holder`` (its sub-model ``model``) with its audio: ``steps`` Euler steps at
    ``shift`` with guidance ``guidance_scale`` (the audio's: ``audio_guidance_scale``, None = the same) at
    ``fps``; a distillation's student on its own schedule (``student_steps``, no guidance: it learnt the
    guided teacher's distribution), as Wan2.2's."""
    distillation = pipeline if isinstance(pipeline, DistributionMatchingDistillation) else None
    if distillation is not None:
        steps, guidance_scale, audio_guidance_scale, shift = None, 1.0, None, None
    modules: dict[str, Any] = {
        "holder": holder,
        "pipeline": getattr(pipeline, "base", pipeline),
        "distillation": distillation,
        "encoders": sampling.encoders,
        "text_len": sampling.text_len,
    }
    video, mel = sample_clip(
        modules, prompt, num_frames=num_frames, height=height, width=width, frame_rate=fps, steps=steps,
        seed=seed, guidance_scale=guidance_scale, audio_guidance_scale=audio_guidance_scale,
        negative_prompt=negative_prompt, shift=shift,
        texts=sampling.texts, device=next(holder.parameters()).device,
    )  # fmt: skip
    if mel is None:
        return SampledClip(video)
    wave, rate = waveform(sampling.encoders, mel)
    return SampledClip(video, wave, rate)
