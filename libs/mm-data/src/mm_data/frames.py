"""Which source frames a sample uses: target fps or stride, offset, frame-count rules."""

from __future__ import annotations

import math
import re

import numpy as np

__all__ = ["check_frame_rule", "frame_step", "sample_frame_indices"]

_RULE = re.compile(r"^\s*(\d+)\s*k\s*\+\s*1\s*$")


def check_frame_rule(num_frames: int, rule: str | None, what: str = "num_frames") -> None:
    """Raise ``ValueError`` unless ``num_frames`` satisfies ``rule`` (``"4k+1"``, ``"8k+1"``, or None)."""
    if num_frames < 1:
        raise ValueError(f"{what} must be >= 1, got {num_frames}")
    if rule is None:
        return
    match = _RULE.match(rule)
    if not match:
        raise ValueError(f"frame_rule {rule!r} not understood; expected a form like '4k+1' or None")
    n = int(match.group(1))
    if (num_frames - 1) % n:
        below = num_frames - 1 - (num_frames - 1) % n + 1
        raise ValueError(
            f"{what}={num_frames} violates frame_rule {rule!r}; the nearest valid values are {below} and {below + n}"
        )


def frame_step(source_fps: float | None, fps: float | None, frame_stride: int | None) -> float:
    """Source frames between two sampled frames: ``source_fps / fps``, ``frame_stride`` or 1."""
    if fps is not None and frame_stride is not None:
        raise ValueError("give fps or frame_stride, not both")
    if frame_stride is not None:
        if frame_stride < 1:
            raise ValueError(f"frame_stride must be >= 1, got {frame_stride}")
        return float(frame_stride)
    if fps is not None:
        if fps <= 0:
            raise ValueError(f"fps must be > 0, got {fps}")
        if not source_fps:
            raise ValueError("the clip has no frame rate; cannot resample to a target fps")
        return source_fps / fps
    return 1.0


def sample_frame_indices(
    available: int,
    num_frames: int,
    step: float,
    offset: str = "random",
    rng: np.random.Generator | None = None,
) -> list[int]:
    """Indices ``floor(start + k * step + 0.5)`` for ``k < num_frames`` inside ``[0, available)``.

    Args:
        available: Frames in the clip.
        num_frames: Frames to sample.
        step: Source frames per sampled frame (see :func:`frame_step`).
        offset: ``"random"`` (uniform start, needs ``rng``), ``"start"`` or ``"center"``.

    Raises:
        ValueError: the clip is too short for ``num_frames`` at this step.
    """
    span = (num_frames - 1) * step
    slack = available - 1 - span
    if slack < -1e-6:
        needed = int(math.floor(span + 1e-6)) + 1
        raise ValueError(f"too short: needs {needed} frames ({num_frames} at step {step:g}), has {available}")
    slack = max(0.0, slack)
    if offset == "start":
        start = 0.0
    elif offset == "center":
        start = float(math.floor(slack / 2))
    elif offset == "random":
        if rng is None:
            raise ValueError("offset='random' needs an rng")
        start = float(rng.integers(0, int(math.floor(slack + 1e-6)) + 1))
    else:
        raise ValueError(f"offset must be 'random', 'start' or 'center', got {offset!r}")
    return [min(available - 1, int(math.floor(start + k * step + 0.5 + 1e-9))) for k in range(num_frames)]
