"""The per-sample caption draw: one of a row's captions, or the empty prompt (caption dropout).

One home for the draw, so that a dataset that reads clips (:class:`~mm_data.VideoTextDataset`) and one
that reads their cached encodings (:class:`~mm_data.CachedVideoTextDataset`) pick the same prompt for
the same ``(seed, epoch, index)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["caption_candidates", "draw_caption", "sample_rng"]


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of one sample's random choices (frame offset, caption, dropout) in one epoch."""
    return np.random.default_rng([seed, epoch, index])


def draw_caption(caption: str | Sequence[str], rng: np.random.Generator, dropout: float) -> str:
    """One caption of ``caption`` (uniform over a list), or ``""`` with probability ``dropout``.

    Draws ``rng.integers`` (lists only), then ``rng.random``: callers that draw other choices from the
    same ``rng`` keep that order.
    """
    text = caption if isinstance(caption, str) else caption[int(rng.integers(len(caption)))]
    return "" if rng.random() < dropout else text


def caption_candidates(caption: str | Sequence[str]) -> list[str]:
    """Every prompt :func:`draw_caption` can return for ``caption``: its distinct captions, then ``""``."""
    texts = [caption] if isinstance(caption, str) else list(caption)
    return list(dict.fromkeys([*texts, ""]))
