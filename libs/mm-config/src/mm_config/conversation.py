"""``data.dataset`` of the ``conversation`` dataset: conversation JSON(L) for (vision-)language models."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator

from .base import ConfigModel, InputPath
from .known_ids import declare_ids, registered_name
from .registry import register_dataset_schema

BUILTIN_TEMPLATES = ("chatml",)
"""mm-data's own chat templates (``mm_data.TEMPLATES`` before plugins add theirs; a test ties them)."""
BUILTIN_MM_PLUGINS = ("text",)
"""mm-data's own multimodal plugins (``mm_data.MM_PLUGINS`` before plugins add theirs)."""


class ConversationColumnsConfig(ConfigModel):
    """Column and tag names of the rows (``null`` = the ``formatting`` default)."""

    messages: str | None = None
    """Column of the turns (ShareGPT ``conversations``, OpenAI ``messages``)."""
    system: str | None = "system"
    """Column of the system prompt (a system turn first in the list works too)."""
    images: str | None = "images"
    """Column of the image paths (one ``<image>`` placeholder each, in order)."""
    videos: str | None = "videos"
    """Column of the video paths (one ``<video>`` placeholder each, in order)."""
    prompt: str = "instruction"
    """Alpaca: column of the user prompt."""
    query: str = "input"
    """Alpaca: column appended to the prompt on a new line."""
    response: str = "output"
    """Alpaca: column of the assistant answer."""
    role_tag: str | None = None
    """Key of a turn's role (ShareGPT ``from``, OpenAI ``role``)."""
    content_tag: str | None = None
    """Key of a turn's text (ShareGPT ``value``, OpenAI ``content``)."""
    user_tag: str | None = None
    """Role value of user turns (ShareGPT ``human``, OpenAI ``user``)."""
    assistant_tag: str | None = None
    """Role value of assistant turns (ShareGPT ``gpt``, OpenAI ``assistant``)."""
    system_tag: str | None = None
    """Role value of a leading system turn (``system``)."""


class ConversationDatasetConfig(ConfigModel):
    """Conversations with images / videos rendered by a chat template, labels on assistant turns."""

    takes_sources: ClassVar[bool] = False  # one conversation file per run (data.sources is refused)

    processor: InputPath | None = None
    """Directory of the tokenizer (and image processor) files, usually the model's own folder."""
    formatting: Literal["sharegpt", "openai", "alpaca"] = "sharegpt"
    """Row layout of ``data.data_path`` (a JSON list or JSONL)."""
    columns: ConversationColumnsConfig = ConversationColumnsConfig()
    """Column and tag names when they differ from the ``formatting`` defaults."""
    template: Annotated[str, registered_name("template", also=("tokenizer",))] = "tokenizer"
    """Chat template: ``tokenizer`` (the tokenizer's own Jinja template) or a registered name (``chatml``)."""
    mm_plugin: Annotated[str, registered_name("mm_plugin")] = "text"
    """Registered multimodal plugin (placeholder checks, media tokens): ``text`` or a model's (``qwen2_vl``)."""
    train_on: Literal["assistant", "last", "all"] = "assistant"
    """Tokens with a loss: every assistant turn, only the last one, or the whole conversation."""
    cutoff_len: int | None = Field(default=None, ge=2)
    """Samples with more tokens (media tokens included) are bad samples; None = no limit."""
    packing: bool = False
    """Pack a micro-batch into one row (position ids restart per sample, no cross-sample attention)."""
    image_max_pixels: int = Field(default=768 * 768, ge=0)
    """Images larger than this many pixels are scaled down (aspect kept); 0 = no limit. A model plugin
    whose processor resizes by its own rule applies that rule with these bounds (``qwen2_vl``: the
    processor's ``smart_resize``, 0 = the processor's own bound), so training sees inference's size."""
    image_min_pixels: int = Field(default=0, ge=0)
    """Images smaller than this many pixels are scaled up; 0 = no limit (see ``image_max_pixels``)."""
    video_max_pixels: int = Field(default=256 * 256, ge=0)
    """Video frames larger than this many pixels are scaled down; 0 = no limit (see ``image_max_pixels``)."""
    video_min_pixels: int = Field(default=0, ge=0)
    """Video frames smaller than this many pixels are scaled up; 0 = no limit."""
    video_fps: float = Field(default=2.0, gt=0)
    """Frames sampled per second of video."""
    video_max_frames: int = Field(default=128, ge=1)
    """At most this many frames per video."""
    max_bad_fraction: float = Field(default=0.05, ge=0, le=1)
    """Stop when more than this fraction of the samples is bad (each is logged with its row and reason)."""
    decode_timeout_s: float | None = Field(default=120.0, gt=0)
    """Seconds one sample may take to read and decode; a sample past it is a bad sample, named with its
    path (a hung read, e.g. a stalled network file system, no longer blocks the step); null = no deadline."""

    @field_validator("processor")
    @classmethod
    def _processor_given(cls, value: str | None) -> str:
        if not value:
            raise ValueError(
                "expected the directory of the tokenizer / processor files (e.g. the model folder)"
            )
        return value


register_dataset_schema("conversation", ConversationDatasetConfig)
declare_ids("template", *BUILTIN_TEMPLATES)
declare_ids("mm_plugin", *BUILTIN_MM_PLUGINS)

__all__ = [
    "BUILTIN_MM_PLUGINS",
    "BUILTIN_TEMPLATES",
    "ConversationColumnsConfig",
    "ConversationDatasetConfig",
]
