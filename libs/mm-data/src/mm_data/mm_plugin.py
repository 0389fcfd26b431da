"""Multimodal plugins: media placeholders checked, media read under pixel and frame budgets, and media
tokens expanded to what the model's processor produces.

Data text marks media with ``<image>`` / ``<video>`` placeholders (one per file, in order). A plugin

1. checks that the placeholders match the sample's media (:meth:`MultimodalPlugin.check`);
2. turns each message into template content: plain text, or a list of ``{"type": "text"|"image"|"video"}``
   parts, so the tokenizer's chat template writes the model's own media markers;
3. reads images (``image_max_pixels`` / ``image_min_pixels``) and videos (``video_fps``,
   ``video_max_frames``, ``video_max_pixels``) with PIL / PyAV;
4. runs the model's processor on them (:meth:`process`, model-specific) and expands each single media
   token of the rendered text to the number of tokens the processor reports for that file.

The base class handles text only (a sample with media is refused); model plugins subclass it and set
``image_token`` / ``video_token`` and :meth:`process`. Plugins are registered in :data:`MM_PLUGINS`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .chat_template import IGNORE_INDEX
from .conversation import Conversation
from .decode import DecodeError, decode_frames, probe_video, require_regular_file
from .registry import Registry

__all__ = ["MM_PLUGINS", "MediaBudget", "MediaFeatures", "MultimodalPlugin", "SampleError", "VideoClip"]

MM_PLUGINS = Registry("multimodal plugin")
"""Multimodal plugin classes by name (``data.dataset.mm_plugin``)."""


class SampleError(ValueError):
    """A sample that cannot be used as it is (placeholders vs media, unreadable media, too long)."""


@dataclass(frozen=True)
class MediaBudget:
    """How media are read: pixel budgets (0 = none) and video frame sampling."""

    image_max_pixels: int = 768 * 768
    image_min_pixels: int = 0
    video_max_pixels: int = 256 * 256
    video_min_pixels: int = 0
    video_fps: float = 2.0
    video_max_frames: int = 128


@dataclass
class VideoClip:
    """Sampled frames ``uint8 [T, H, W, 3]`` and the rate they were sampled at (frames per second)."""

    frames: np.ndarray
    fps: float


@dataclass
class MediaFeatures:
    """What the processor made of a sample's media: model input tensors (concatenated over files,
    e.g. ``pixel_values``, ``image_grid_thw``) and the token count of each image and video."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    image_tokens: list[int] = field(default_factory=list)
    video_tokens: list[int] = field(default_factory=list)


@MM_PLUGINS.register("text")
class MultimodalPlugin:
    """Text-only base plugin; model plugins override :attr:`image_token`, :attr:`video_token`,
    :attr:`frame_multiple` and :meth:`process`."""

    image_placeholder = "<image>"
    video_placeholder = "<video>"
    #: the token the chat template writes once per image / video (None: the modality is unsupported)
    image_token: str | None = None
    video_token: str | None = None
    #: sampled frame counts are rounded down to a multiple of this (a temporal patch size)
    frame_multiple = 1

    def __init__(
        self, tokenizer: Any, image_processor: Any = None, *, budget: MediaBudget | None = None
    ) -> None:
        self.tokenizer, self.image_processor = tokenizer, image_processor
        self.budget = budget or MediaBudget()
        self.image_token_id = self._token_id(self.image_token)
        self.video_token_id = self._token_id(self.video_token)
        self._split = re.compile(f"({re.escape(self.image_placeholder)}|{re.escape(self.video_placeholder)})")

    def _token_id(self, token: str | None) -> int | None:
        if token is None:
            return None
        ids = self.tokenizer.convert_tokens_to_ids([token])
        if ids[0] is None or ids[0] == getattr(self.tokenizer, "unk_token_id", None):
            raise ValueError(f"{type(self).__name__}: the tokenizer has no token {token!r}")
        return int(ids[0])

    # -- 1. placeholders -----------------------------------------------------------------------
    def check(self, conversation: Conversation) -> None:
        """Raise :class:`SampleError` unless placeholders and media agree in number (and are supported)."""
        text = "".join(m.content for m in conversation.messages) + (conversation.system or "")
        for kind, placeholder, files, token in (
            ("image", self.image_placeholder, conversation.images, self.image_token),
            ("video", self.video_placeholder, conversation.videos, self.video_token),
        ):
            count = text.count(placeholder)
            if count != len(files):
                raise SampleError(
                    f"{count} {placeholder} placeholder(s) in the text but {len(files)} {kind}(s) listed"
                )
            if files and token is None:
                raise SampleError(f"{type(self).__name__} takes no {kind}s ({len(files)} listed)")

    # -- 2. template content -------------------------------------------------------------------
    def template_messages(self, conversation: Conversation) -> list[dict[str, Any]]:
        """Messages for the chat template: media placeholders become ``image`` / ``video`` parts."""
        out = [{"role": "system", "content": conversation.system}] if conversation.system else []
        return out + [{"role": m.role, "content": self._content(m.content)} for m in conversation.messages]

    def _content(self, text: str) -> str | list[dict[str, str]]:
        pieces = [p for p in self._split.split(text) if p]
        if not any(p in (self.image_placeholder, self.video_placeholder) for p in pieces):
            return text
        kinds = {self.image_placeholder: "image", self.video_placeholder: "video"}
        return [{"type": kinds[p]} if p in kinds else {"type": "text", "text": p} for p in pieces]

    # -- 3. reading media ----------------------------------------------------------------------
    def image_size(self, height: int, width: int) -> tuple[int, int]:
        """The size an image of ``height x width`` is read at: aspect kept, scaled into
        ``[image_min_pixels, image_max_pixels]``. A model plugin whose processor resizes by its own rule
        returns the size unchanged and has the processor apply that rule with these bounds in
        :meth:`process`, so an image is resized once, as at inference."""
        return _budget_size(height, width, self.budget.image_min_pixels, self.budget.image_max_pixels)

    def video_size(self, height: int, width: int) -> tuple[int, int]:
        """The size video frames of ``height x width`` are decoded at (scaled into the video pixel budget)."""
        return _budget_size(height, width, self.budget.video_min_pixels, self.budget.video_max_pixels)

    def load_image(self, path: str) -> Any:
        """An RGB PIL image at :meth:`image_size`."""
        from PIL import Image

        _regular_file("image", path)
        try:
            with Image.open(path) as im:
                image = im.convert("RGB")
        except OSError as e:
            raise SampleError(f"image {path}: cannot read: {e}") from e
        h, w = self.image_size(image.height, image.width)
        return image if (h, w) == (image.height, image.width) else image.resize((w, h), Image.BICUBIC)

    def load_video(self, path: str) -> VideoClip:
        """Frames at ``video_fps`` (at most ``video_max_frames``, a multiple of :attr:`frame_multiple`),
        decoded at :meth:`video_size`."""
        _regular_file("video", path)
        try:
            info = probe_video(path)
            fps = info.fps or self.budget.video_fps
            count = min(
                info.num_frames,
                self.budget.video_max_frames,
                math.floor(info.num_frames / fps * self.budget.video_fps),
            )
            count -= count % self.frame_multiple
            if count < max(1, self.frame_multiple):
                raise SampleError(
                    f"video {path}: {info.num_frames} frames at {fps:g} fps give {count} frames at "
                    f"video_fps={self.budget.video_fps:g}; at least {max(1, self.frame_multiple)} needed"
                )
            indices = np.linspace(0, info.num_frames - 1, count).round().astype(int).tolist()
            h, w = self.video_size(info.height, info.width)
            frames = decode_frames(path, indices, h, w, info)
        except DecodeError as e:
            raise SampleError(str(e)) from e
        return VideoClip(frames, fps * count / info.num_frames)

    # -- 4. processor and expansion ------------------------------------------------------------
    def process(self, images: Sequence[Any], videos: Sequence[VideoClip]) -> MediaFeatures:
        """Model inputs and per-file token counts for the media of one sample (model plugins override)."""
        if images or videos:
            raise SampleError(f"{type(self).__name__} processes no media")
        return MediaFeatures()

    def expand(
        self, input_ids: list[int], labels: list[int], features: MediaFeatures
    ) -> tuple[list[int], list[int]]:
        """Replace the k-th media token by ``features`` ' k-th token count copies (labels: ignored)."""
        media: dict[int, list[int]] = {}
        for token, kind, counts in (
            (self.image_token_id, "image", features.image_tokens),
            (self.video_token_id, "video", features.video_tokens),
        ):
            if token is None:
                continue
            found = input_ids.count(token)
            if found != len(counts):
                raise SampleError(
                    f"the chat template wrote {found} {kind} token(s) for {len(counts)} {kind}(s)"
                )
            media[token] = list(counts)
        ids: list[int] = []
        out_labels: list[int] = []
        for token, label in zip(input_ids, labels):
            if token in media:
                n = media[token].pop(0)
                ids += [token] * n
                out_labels += [IGNORE_INDEX] * n
            else:
                ids.append(token)
                out_labels.append(label)
        return ids, out_labels

    def token_type_ids(self, input_ids: list[int]) -> list[int]:
        """0 for text, 1 for image tokens, 2 for video tokens."""
        kinds = {self.image_token_id: 1, self.video_token_id: 2}
        return [kinds.get(t, 0) for t in input_ids]


def _regular_file(kind: str, path: str) -> None:
    """:class:`SampleError` unless ``path`` is a regular file (a FIFO is refused without opening it)."""
    try:
        require_regular_file(path)
    except DecodeError as e:
        raise SampleError(f"{kind} {e}") from None


def _budget_size(height: int, width: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(h, w) with the aspect ratio of (height, width) scaled into ``[min_pixels, max_pixels]`` (0 = no bound)."""
    pixels = height * width
    scale = 1.0
    if max_pixels and pixels > max_pixels:
        scale = math.sqrt(max_pixels / pixels)
    elif min_pixels and pixels < min_pixels:
        scale = math.sqrt(min_pixels / pixels)
    if scale == 1.0:
        return height, width
    return max(1, int(height * scale)), max(1, int(width * scale))
