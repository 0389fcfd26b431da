"""Aspect-ratio / resolution buckets: each sample goes to its nearest (H, W, T) bucket."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

__all__ = ["Bucket", "make_buckets", "parse_buckets", "assign_bucket", "same_bucket_order"]

DEFAULT_ASPECT_RATIOS = (9 / 16, 2 / 3, 3 / 4, 1.0, 4 / 3, 3 / 2, 16 / 9)  # height / width


class Bucket(NamedTuple):
    """A target size: ``height`` x ``width`` pixels and ``num_frames`` frames."""

    height: int
    width: int
    num_frames: int

    @property
    def aspect(self) -> float:
        """Height / width."""
        return self.height / self.width


def make_buckets(
    pixel_budget: int,
    num_frames: int,
    aspect_ratios: Sequence[float] = DEFAULT_ASPECT_RATIOS,
    multiple: int = 16,
) -> list[Bucket]:
    """One bucket per aspect ratio (height / width) with about ``pixel_budget`` pixels per frame.

    Sides are rounded down to a multiple of ``multiple`` so the area never exceeds the budget.
    """
    if pixel_budget < multiple * multiple:
        raise ValueError(f"pixel_budget={pixel_budget} is smaller than one {multiple}x{multiple} tile")
    out: list[Bucket] = []
    for ratio in aspect_ratios:
        if ratio <= 0:
            raise ValueError(f"aspect ratio must be > 0, got {ratio}")
        h = max(multiple, int(math.sqrt(pixel_budget * ratio)) // multiple * multiple)
        w = max(multiple, int(pixel_budget / h) // multiple * multiple)
        bucket = Bucket(h, w, num_frames)
        if bucket not in out:
            out.append(bucket)
    return out


def parse_buckets(spec: Any, num_frames: int) -> list[Bucket]:
    """Buckets from a YAML-friendly spec.

    Accepts a list of ``(H, W, T)`` / ``(H, W)`` triples/pairs or ``{"height", "width", "num_frames"}``
    dicts (``T`` defaults to ``num_frames``), or ``{"pixel_budget": N, "aspect_ratios": [...],
    "multiple": 16, "num_frames": T}``.
    """
    if isinstance(spec, Mapping):
        unknown = set(spec) - {"pixel_budget", "aspect_ratios", "multiple", "num_frames"}
        if "pixel_budget" not in spec or unknown:
            raise ValueError(
                f"bucket spec {dict(spec)!r}: expected keys pixel_budget (required), aspect_ratios, "
                f"multiple, num_frames; unknown {sorted(unknown)}"
            )
        return make_buckets(
            int(spec["pixel_budget"]),
            int(spec.get("num_frames", num_frames)),
            tuple(spec.get("aspect_ratios", DEFAULT_ASPECT_RATIOS)),
            int(spec.get("multiple", 16)),
        )
    buckets = []
    for item in spec:
        if isinstance(item, Mapping):
            item = (item["height"], item["width"], item.get("num_frames", num_frames))
        if len(item) not in (2, 3):
            raise ValueError(f"bucket {item!r}: expected (height, width) or (height, width, num_frames)")
        h, w, t = (*item, num_frames) if len(item) == 2 else item
        buckets.append(Bucket(int(h), int(w), int(t)))
    if not buckets:
        raise ValueError("buckets must not be empty")
    return buckets


def assign_bucket(height: int, width: int, available_frames: int | None, buckets: Sequence[Bucket]) -> int:
    """Index of the nearest bucket for a sample of ``height`` x ``width`` with ``available_frames``.

    Nearest = smallest ``|log(aspect ratio)|`` distance among buckets whose frame count fits
    (all buckets when none fits); ties go to more frames, then more pixels, then the lower index.
    """
    fitting = [
        i for i, b in enumerate(buckets) if available_frames is None or b.num_frames <= available_frames
    ]
    candidates = fitting or list(range(len(buckets)))
    target = math.log(height / width)

    def key(i: int) -> tuple[float, int, int, int]:
        b = buckets[i]
        return (round(abs(math.log(b.aspect) - target), 9), -b.num_frames, -b.height * b.width, i)

    return min(candidates, key=key)


def same_bucket_order(bucket_ids: Sequence[int], index: int) -> Iterator[int]:
    """``index``, then the following indices of its bucket (wrapping around): where a dataset looks for
    the replacement of a bad sample, so that the replacement keeps the batch's size."""
    n = len(bucket_ids)
    for offset in range(n):
        source = (index + offset) % n
        if bucket_ids[source] == bucket_ids[index]:
            yield source
