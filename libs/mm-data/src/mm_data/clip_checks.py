"""Checks of what a generated clip shows: PSNR against a reference, and whether a synthetic clip's
shape moves the way its caption says.

``psnr`` takes videos in ``[-1, 1]`` (what VAEs decode to); the shape checks take ``uint8 [T, H, W, 3]``
frames of the synthetic clips of :mod:`mm_data.synthetic` (one coloured shape on a dark grey
background) or of a sample generated for one of their captions.
"""

from __future__ import annotations

import re

import numpy as np
import torch

from .synthetic import BACKGROUND, DIRECTIONS

__all__ = ["caption_direction", "moves_as_captioned", "psnr", "shape_centroids"]

#: A pixel belongs to the shape when some channel differs from the background by more than this.
SHAPE_THRESHOLD = 60


def psnr(video: torch.Tensor, reference: torch.Tensor) -> float:
    """Peak signal-to-noise ratio in dB of ``video`` against ``reference``, both in ``[-1, 1]``
    (the peak-to-peak range 2, i.e. the usual 8-bit PSNR); ``inf`` when they are equal."""
    if video.shape != reference.shape:
        raise ValueError(f"psnr: shapes differ, {tuple(video.shape)} vs {tuple(reference.shape)}")
    mse = ((video.float() - reference.float()) / 2).pow(2).mean()
    return float("inf") if mse == 0 else float(-10 * torch.log10(mse))


def caption_direction(caption: str) -> tuple[int, int]:
    """The ``(dx, dy)`` unit step a synthetic caption names (``... moving left``: ``(-1, 0)``)."""
    words = set(re.findall(r"[a-z]+", caption.lower()))
    named = [d for d in DIRECTIONS if d in words]
    if len(named) != 1:
        raise ValueError(f"caption {caption!r}: expected exactly one of {list(DIRECTIONS)}, found {named}")
    return DIRECTIONS[named[0]]


def shape_centroids(frames: np.ndarray) -> np.ndarray:
    """``[T, 2]`` (x, y) centroid of each frame's shape pixels (NaN for a frame without any).

    ``frames`` is ``uint8 [T, H, W, 3]``; shape pixels differ from the synthetic background colour by
    more than ``SHAPE_THRESHOLD`` in some channel.
    """
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be [T, H, W, 3], got shape {tuple(frames.shape)}")
    diff = np.abs(frames.astype(np.int16) - np.array(BACKGROUND, np.int16)).max(axis=-1)
    mask = diff > SHAPE_THRESHOLD
    yy, xx = np.mgrid[0 : frames.shape[1], 0 : frames.shape[2]]
    out = np.full((frames.shape[0], 2), np.nan)
    for t, m in enumerate(mask):
        if m.any():
            out[t] = (xx[m].mean(), yy[m].mean())
    return out


def moves_as_captioned(frames: np.ndarray, caption: str, min_step: float = 0.25) -> bool:
    """Whether the shape's centroid moves at least ``min_step`` pixels in the captioned direction in
    every consecutive frame pair (False when some frame shows no shape)."""
    centroids = shape_centroids(frames)
    if np.isnan(centroids).any() or len(centroids) < 2:
        return False
    steps = np.diff(centroids, axis=0) @ np.array(caption_direction(caption), dtype=np.float64)
    return bool((steps >= min_step).all())
