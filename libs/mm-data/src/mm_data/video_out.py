"""Write a generated video tensor (a sampled clip) as an mp4."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .synthetic import write_clip

__all__ = ["write_video"]


def write_video(video: torch.Tensor, path: str | Path, fps: int = 16) -> Path:
    """Write ``video`` ``[3, F, H, W]`` in ``[-1, 1]`` as an H.264 mp4 at ``path`` (folders made);
    H and W must be even. Returns ``path``."""
    frames = ((video.permute(1, 2, 3, 0).float() + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_clip(path, np.ascontiguousarray(frames.cpu().numpy()), fps=fps)
    return path
