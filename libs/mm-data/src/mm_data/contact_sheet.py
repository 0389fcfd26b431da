"""A contact sheet PNG: rows of labelled clip frames side by side, and a loss curve below them.

Drawn with Pillow alone. The layout is fixed by the inputs (see :func:`contact_sheet_size`), so a
caller can check a sheet's size: each row is a text band of ``LABEL_HEIGHT`` pixels over the frames
(scaled by ``scale``, ``PAD`` pixels apart); the loss panel is ``CURVE_HEIGHT`` pixels high.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

__all__ = ["contact_sheet", "contact_sheet_size", "write_contact_sheet"]

PAD = 4
LABEL_HEIGHT = 14
CURVE_HEIGHT = 120
SHEET_BACKGROUND = (255, 255, 255)
INK = (20, 20, 20)
CURVE = (200, 40, 40)


def contact_sheet_size(
    num_frames: int, height: int, width: int, num_rows: int, *, scale: int = 2, with_losses: bool = True
) -> tuple[int, int]:
    """``(width, height)`` in pixels of a sheet of ``num_rows`` rows of ``num_frames`` frames."""
    sheet_w = PAD + num_frames * (width * scale + PAD)
    sheet_h = PAD + num_rows * (LABEL_HEIGHT + height * scale + PAD)
    return sheet_w, sheet_h + (CURVE_HEIGHT + PAD if with_losses else 0)


def contact_sheet(
    rows: Sequence[tuple[str, np.ndarray]], losses: Sequence[float] | None = None, *, scale: int = 2
) -> Image.Image:
    """The sheet as an RGB image: one row per ``(label, uint8 frames [T, H, W, 3])``, all of one shape,
    then (when ``losses`` is given) the loss per logged step as a polyline with its first/last values."""
    if not rows:
        raise ValueError("contact_sheet: no rows")
    shapes = {frames.shape for _, frames in rows}
    if len(shapes) != 1 or len(next(iter(shapes))) != 4 or next(iter(shapes))[-1] != 3:
        raise ValueError(
            f"contact_sheet: every row needs frames of one shape [T, H, W, 3], got {sorted(shapes)}"
        )
    t, h, w, _ = next(iter(shapes))
    size = contact_sheet_size(t, h, w, len(rows), scale=scale, with_losses=losses is not None)
    sheet = Image.new("RGB", size, SHEET_BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    top = PAD
    for label, frames in rows:
        draw.text((PAD, top), label, fill=INK)
        top += LABEL_HEIGHT
        for k, frame in enumerate(frames):
            tile = Image.fromarray(np.ascontiguousarray(frame, dtype=np.uint8)).resize(
                (w * scale, h * scale), Image.NEAREST
            )
            sheet.paste(tile, (PAD + k * (w * scale + PAD), top))
        top += h * scale + PAD
    if losses is not None:
        _draw_losses(draw, list(losses), (PAD, top, size[0] - PAD, top + CURVE_HEIGHT))
    return sheet


def write_contact_sheet(
    path: str | Path,
    rows: Sequence[tuple[str, np.ndarray]],
    losses: Sequence[float] | None = None,
    *,
    scale: int = 2,
) -> Path:
    """Write :func:`contact_sheet` as a PNG at ``path``; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    contact_sheet(rows, losses, scale=scale).save(path, format="PNG")
    return path


def _draw_losses(draw: ImageDraw.ImageDraw, losses: list[float], box: tuple[int, int, int, int]) -> None:
    left, top, right, bottom = box
    draw.rectangle(box, outline=INK)
    finite = [v for v in losses if np.isfinite(v)]
    if not finite:
        draw.text((left + 4, top + 4), "loss: no finite values", fill=INK)
        return
    low, high = min(finite), max(finite)
    span = (high - low) or 1.0
    inner_top, inner_bottom = top + LABEL_HEIGHT + 2, bottom - 4
    steps = max(1, len(losses) - 1)
    points = [
        (
            left + 4 + (right - left - 8) * i / steps,
            inner_bottom - (inner_bottom - inner_top) * (v - low) / span,
        )
        for i, v in enumerate(losses)
        if np.isfinite(v)
    ]
    if len(points) > 1:
        draw.line(points, fill=CURVE, width=1)
    caption = (
        f"loss over {len(losses)} logged steps: first {losses[0]:.4g}, last {losses[-1]:.4g} (max {high:.3g})"
    )
    draw.text((left + 4, top + 2), caption, fill=INK)
