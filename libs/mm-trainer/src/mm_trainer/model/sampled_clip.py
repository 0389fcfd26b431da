"""What a container's ``sample`` hook returns: a clip, and its audio where the model makes sound."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SampledClip", "as_sampled_clip"]


@dataclass(frozen=True)
class SampledClip:
    """A sampled clip: ``video`` ``[3, F, H, W]`` in ``[-1, 1]`` and, for a model that samples sound (LTX-2),
    ``audio`` ``[channels, N]`` in ``[-1, 1]`` at ``sample_rate`` Hz."""

    video: torch.Tensor
    audio: torch.Tensor | None = None
    sample_rate: int | None = None

    def __post_init__(self) -> None:
        if self.video.ndim != 4 or self.video.shape[0] != 3:
            raise ValueError(f"SampledClip.video: expected [3, F, H, W], got shape {tuple(self.video.shape)}")
        if self.audio is not None and (self.audio.ndim != 2 or not self.sample_rate):
            raise ValueError(
                f"SampledClip.audio: expected [channels, N] with a sample_rate, got shape "
                f"{tuple(self.audio.shape)} at {self.sample_rate}"
            )


def as_sampled_clip(sampled: torch.Tensor | SampledClip) -> SampledClip:
    """A ``sample`` hook's result as a :class:`SampledClip` (a bare tensor is a silent clip)."""
    return sampled if isinstance(sampled, SampledClip) else SampledClip(sampled)
