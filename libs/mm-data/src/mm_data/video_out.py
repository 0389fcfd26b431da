"""A generated video tensor (a sampled clip) as ``uint8`` frames, or written as an mp4."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .synthetic import write_clip

__all__ = ["to_video_frames", "write_video"]


def to_video_frames(video: torch.Tensor) -> np.ndarray:
    """``[3, T, H, W]`` in ``[-1, 1]`` -> ``uint8 [T, H, W, 3]`` (rounded, clipped): the inverse of
    :func:`mm_data.to_video_tensor`."""
    if video.ndim != 4 or video.shape[0] != 3:
        raise ValueError(f"expected a video [3, T, H, W], got shape {tuple(video.shape)}")
    frames = ((video.detach().permute(1, 2, 3, 0).float().cpu() + 1) * 127.5).round().clamp(0, 255)
    return np.ascontiguousarray(frames.to(torch.uint8).numpy())


def write_video(video: torch.Tensor, path: str | Path, fps: int = 16) -> Path:
    """Write ``video`` ``[3, F, H, W]`` in ``[-1, 1]`` as an H.264 mp4 at ``path`` (folders made);
    H and W must be even. Returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_clip(path, to_video_frames(video), fps=fps)
    return path
