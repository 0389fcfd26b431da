"""Schemas of the built-in dataset ids, ``data.dataset`` of ``video_text``, ``video_pairs`` and
``precomputed_latents``.

mm-trainer registers the builders of these ids (``mm_data.VideoTextDataset`` and
``mm_data.PrecomputedLatentDataset``); their keyword arguments are part of the framework's YAML,
so their schemas live here, where ``mm-config check`` sees them without importing torch. A test in
mm-trainer ties each schema to its dataset's signature.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from .base import ConfigModel, PartialConfigModel
from .errors import Problem, RuleViolations
from .registry import register_dataset_schema

_FRAME_RULE = re.compile(r"^\s*(\d+)\s*k\s*\+\s*1\s*$")


def frame_rule_problem(num_frames: int, rule: str | None) -> str | None:
    """Why ``num_frames`` breaks ``rule`` (``"4k+1"``, ``"8k+1"``; None = any count), or None."""
    if rule is None:
        return None
    match = _FRAME_RULE.match(rule)
    if not match:
        return f"frame_rule {rule!r} not understood; expected a form like '4k+1' or null"
    n = int(match.group(1))
    if (num_frames - 1) % n == 0:
        return None
    below = num_frames - 1 - (num_frames - 1) % n + 1
    return f"violates frame_rule {rule!r}; the nearest valid values are {below} and {below + n}"


class VideoTextDatasetConfig(PartialConfigModel):
    """``data.dataset`` of ``video_text`` (``mm_data.VideoTextDataset`` over the metadata file
    ``data.data_path``, whose relative media paths resolve against ``data.data_root``; or over a caption
    folder ``data.data_path``: clips / images with a same-named ``.txt`` caption each, in sorted order)."""

    needs_data_path: ClassVar[bool] = True
    reads_data_root: ClassVar[bool] = True
    removed_keys: ClassVar[dict[str, str]] = {
        "max_text_length": "the trainer's text encoder tokenizes the prompts, not the dataset; its length "
        "is the text encoder's (wan22-train: model.models.text_encoder.config.text_len)",
        "return_first_frame": "image conditioning takes the first frame from the clip itself "
        "(model.pipeline.task: i2v or ti2v)",
    }
    """Keys this schema refused since they did nothing on the trainer path, and where the setting is now."""

    num_frames: int = Field(ge=1)
    """Frames per sample (the VAE's rule, e.g. 4k+1 for Wan)."""
    height: int = Field(ge=1)
    """Frame height in pixels."""
    width: int = Field(ge=1)
    """Frame width in pixels."""
    fps: float | None = Field(default=None, gt=0)
    """Resample clips to this frame rate; None = every source frame (or ``frame_stride``)."""
    frame_stride: int | None = Field(default=None, ge=1)
    """Take every n-th source frame (instead of ``fps``)."""
    frame_rule: str | None = "4k+1"
    """Rule every frame count must follow (``Nk+1``); None = any."""
    buckets: list[Any] | dict[str, Any] | None = None
    """Size buckets: ``[[H, W, T], ...]`` / ``[{height, width, num_frames}, ...]`` or
    ``{pixel_budget, aspect_ratios, multiple, num_frames}``; None = one bucket of the sizes above."""
    caption_dropout: float = Field(default=0.0, ge=0, le=1)
    """Probability of an empty prompt (for classifier-free guidance)."""
    max_bad_fraction: float = Field(default=0.05, ge=0, le=1)
    """Stop when more than this fraction of an epoch's samples is unreadable."""
    seed: int = Field(default=0, ge=0)
    """Seed of the per-sample random choices (offset, caption, dropout)."""
    columns: dict[str, str | list[str]] | None = None
    """Source column name(s) per canonical metadata key (``path``, ``caption``, ...); metadata files only
    (refused with a caption folder)."""
    frame_offset: Literal["random", "start", "center"] = "random"
    """Where in a clip the sampled frames start."""
    decode_timeout_s: float | None = Field(default=120.0, gt=0)
    """Seconds one sample may take to read and decode; a sample past it is a bad sample, named with its
    path (a hung read, e.g. a stalled network file system, no longer blocks the step); null = no deadline."""

    @model_validator(mode="after")
    def _frames_follow_the_rule(self) -> VideoTextDatasetConfig:
        problems = []
        if self.fps is not None and self.frame_stride is not None:
            problems.append(
                Problem(("frame_stride",), "give fps or frame_stride, not both", deps=(("fps",),))
            )
        why = frame_rule_problem(self.num_frames, self.frame_rule)
        if why is not None:
            problems.append(Problem(("num_frames",), why, self.num_frames, deps=(("frame_rule",),)))
        if problems:
            raise RuleViolations(problems)
        return self


class PrecomputedLatentsConfig(PartialConfigModel):
    """``data.dataset`` of ``precomputed_latents`` (``mm_data.PrecomputedLatentDataset`` over the cache
    folder ``data.data_path``)."""

    needs_data_path: ClassVar[bool] = True
    reads_data_root: ClassVar[bool] = False

    required: list[str] = ["latents", "prompt_embeds", "prompt_attention_mask"]
    """Tensors every sample file must hold."""


class VideoPairsConfig(ConfigModel):
    """``data.dataset`` of ``video_pairs`` (``mm_data.PreferencePairs`` over the pairs file ``data.data_path``:
    a JSON list of ``{caption, preferred, rejected}`` rows, clip paths relative to ``data.data_root``,
    default the file's folder): Diffusion-DPO's offline pairs."""

    needs_data_path: ClassVar[bool] = True
    reads_data_root: ClassVar[bool] = True
    takes_sources: ClassVar[bool] = False  # a pairs file per run: several are not joined (data.sources)

    num_frames: int = Field(ge=1)
    """Frames of each clip, from its first (every source frame)."""
    height: int = Field(ge=1)
    """Frame height in pixels."""
    width: int = Field(ge=1)
    """Frame width in pixels."""
    frame_rule: str | None = "4k+1"
    """Rule every frame count must follow (``Nk+1``); None = any."""

    @model_validator(mode="after")
    def _frames_follow_the_rule(self) -> VideoPairsConfig:
        why = frame_rule_problem(self.num_frames, self.frame_rule)
        if why is not None:
            raise RuleViolations([Problem(("num_frames",), why, self.num_frames, deps=(("frame_rule",),))])
        return self


register_dataset_schema("video_text", VideoTextDatasetConfig)
register_dataset_schema("video_pairs", VideoPairsConfig)
register_dataset_schema("precomputed_latents", PrecomputedLatentsConfig)

__all__ = ["PrecomputedLatentsConfig", "VideoTextDatasetConfig", "frame_rule_problem"]
