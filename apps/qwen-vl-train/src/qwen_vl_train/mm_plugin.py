"""The ``qwen2_vl`` multimodal plugin (Qwen2-VL and Qwen2.5-VL): media through the model's image processor.

The chat template writes ``<|vision_start|><|image_pad|><|vision_end|>`` once per image (and
``<|video_pad|>`` per video); each pad token is expanded to ``grid_t * grid_h * grid_w / merge_size**2``
tokens, the count the processor's ``image_grid_thw`` / ``video_grid_thw`` give and the vision tower's
merger produces.

Images are resized once, by the processor (``Qwen2VLImageProcessor``'s ``smart_resize``: sides multiples of
``patch_size * merge_size``, pixels within the bounds) with ``image_min_pixels`` / ``image_max_pixels`` as
its bounds (0: the processor's own), so a training image has the resolution and the pixel values the
processor gives the raw image at inference with the same bounds. (Scaling into the budget first and
letting the processor round again trained a 96x80 image at 72x56 where inference sees 64x56.)

Videos: frames sampled by mm-data (``video_fps``, ``video_max_frames``, a multiple of the temporal patch
size) go through the image processor frame by frame (resize, rescale, normalize, patchify) and are
stacked ``temporal_patch_size`` frames per patch, the layout of ``Qwen2VLVideoProcessor`` (whose
torchvision backend is not needed this way); ``second_per_grid_ts`` = temporal patch / sampled fps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from mm_data import MM_PLUGINS, MediaBudget, MediaFeatures, MultimodalPlugin, VideoClip
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize  # torchvision-free copy


@MM_PLUGINS.register("qwen2_vl")
class QwenVLPlugin(MultimodalPlugin):
    """Placeholders and media tokens of Qwen2-VL / Qwen2.5-VL."""

    image_token = "<|image_pad|>"
    video_token = "<|video_pad|>"

    def __init__(
        self, tokenizer: Any, image_processor: Any = None, *, budget: MediaBudget | None = None
    ) -> None:
        if image_processor is None:
            raise ValueError("the qwen2_vl plugin needs the image processor (preprocessor_config.json)")
        super().__init__(tokenizer, image_processor, budget=budget)
        self.frame_multiple = int(image_processor.temporal_patch_size)
        self.merge = int(image_processor.merge_size)

    def pixel_bounds(self, min_pixels: int, max_pixels: int) -> dict[str, int]:
        """The processor's ``size`` for budget bounds (0: the processor's own bound)."""
        own = self.image_processor.size
        return {
            "shortest_edge": min_pixels or own["shortest_edge"],
            "longest_edge": max_pixels or own["longest_edge"],
        }

    def image_size(self, height: int, width: int) -> tuple[int, int]:
        """Unchanged: :meth:`process` has the processor resize the raw image (once)."""
        return height, width

    def video_size(self, height: int, width: int) -> tuple[int, int]:
        """The processor's rule (``smart_resize``) within the video budget: frames are decoded at a size the
        processor keeps, so they too are resized once."""
        b = self.budget
        bounds = self.pixel_bounds(b.video_min_pixels, b.video_max_pixels)
        factor = int(self.image_processor.patch_size) * self.merge
        return smart_resize(height, width, factor, bounds["shortest_edge"], bounds["longest_edge"])

    def process(self, images: Sequence[Any], videos: Sequence[VideoClip]) -> MediaFeatures:
        out = MediaFeatures()
        if images:
            size = self.pixel_bounds(self.budget.image_min_pixels, self.budget.image_max_pixels)
            result = self.image_processor(images=list(images), size=size, return_tensors="pt")
            out.tensors["pixel_values"] = result["pixel_values"]
            out.tensors["image_grid_thw"] = result["image_grid_thw"]
            out.image_tokens = self._tokens(result["image_grid_thw"])
        if videos:
            patches, grids = zip(*(self.video_patches(clip.frames) for clip in videos))
            tp = self.frame_multiple
            out.tensors["pixel_values_videos"] = torch.cat(patches)
            out.tensors["video_grid_thw"] = torch.stack(grids)
            out.tensors["second_per_grid_ts"] = torch.tensor([tp / clip.fps for clip in videos])
            out.video_tokens = self._tokens(out.tensors["video_grid_thw"])
        return out

    def _tokens(self, grid_thw: torch.Tensor) -> list[int]:
        return (grid_thw.prod(-1) // self.merge**2).tolist()

    def video_patches(self, frames: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """``uint8 [T, H, W, 3]`` -> patches ``[grid_t * grid_h * grid_w, C * tp * p * p]`` and ``(t, h, w)``."""
        tp = self.frame_multiple
        if len(frames) % tp:  # repeat the last frame, as the video processor does
            frames = np.concatenate([frames, np.repeat(frames[-1:], tp - len(frames) % tp, axis=0)])
        size = self.pixel_bounds(self.budget.video_min_pixels, self.budget.video_max_pixels)
        result = self.image_processor(
            images=[Image.fromarray(f) for f in frames], size=size, return_tensors="pt"
        )
        grid = result["image_grid_thw"][0]
        per_frame = int(grid[1] * grid[2])
        p = int(self.image_processor.patch_size)
        # each frame's patches: [positions, C, tp (one frame broadcast), p, p]; keep one copy per frame
        x = result["pixel_values"].view(len(frames), per_frame, -1, tp, p, p)[:, :, :, 0]
        channels = x.shape[2]
        # [grid_t, tp, positions, C, p, p] -> [grid_t, positions, C, tp, p, p]
        x = x.view(len(frames) // tp, tp, per_frame, channels, p, p).permute(0, 2, 3, 1, 4, 5)
        grid_thw = torch.tensor([len(frames) // tp, int(grid[1]), int(grid[2])])
        return x.reshape(-1, channels * tp * p * p).contiguous(), grid_thw
