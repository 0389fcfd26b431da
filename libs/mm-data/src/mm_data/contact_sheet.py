"""A contact sheet PNG: rows of labelled clip frames side by side, and a loss plot below them.

Drawn with Pillow alone. The layout is fixed by the inputs (see :func:`contact_sheet_size`), so a
caller can check a sheet's size: each row is a text band of ``LABEL_HEIGHT`` pixels over the frames
(scaled by ``scale``, ``PAD`` pixels apart); the loss panel is ``CURVE_HEIGHT`` pixels high and at
least ``PANEL_MIN_WIDTH`` wide. The panel is a plot with axes: the optimizer step across (ticks and
the title ``step``), the loss up (ticks and the title ``loss``), the raw curve in ``RAW`` and, when
given, a smoothed one in ``SMOOTHED`` over it, named in a legend.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

__all__ = [
    "LossCurve", "contact_sheet", "contact_sheet_size", "loss_plot_area", "smooth_losses", "write_contact_sheet",
]  # fmt: skip

PAD = 4
LABEL_HEIGHT = 14
CURVE_HEIGHT = 180
PANEL_MIN_WIDTH = 360
SHEET_BACKGROUND = (255, 255, 255)
INK = (20, 20, 20)
RAW = (240, 160, 160)
SMOOTHED = (190, 30, 30)
#: Pixels of the panel outside its plot area: the title band and tick labels and axis titles around it.
PLOT_MARGIN = {"left": 56, "right": 10, "top": LABEL_HEIGHT + 8, "bottom": 30}


@dataclass(frozen=True)
class LossCurve:
    """The loss of each logged step (``steps[i]``: ``raw[i]``), and optionally a smoothed copy of it
    (one value per step) with the name the legend gives it."""

    steps: Sequence[int]
    raw: Sequence[float]
    smoothed: Sequence[float] | None = None
    smoothed_label: str = "smoothed"

    def __post_init__(self) -> None:
        if len(self.steps) != len(self.raw) or (
            self.smoothed is not None and len(self.smoothed) != len(self.raw)
        ):
            raise ValueError(
                f"LossCurve: {len(self.steps)} steps, {len(self.raw)} raw values and "
                f"{len(self.smoothed or [])} smoothed ones; expected one of each per step"
            )

    @classmethod
    def smoothed_by(cls, steps: Sequence[int], raw: Sequence[float], weight: float) -> LossCurve:
        """The curve of ``raw`` with its :func:`smooth_losses` at ``weight``, named so in the legend."""
        return cls(steps, raw, smooth_losses(raw, weight), f"smoothed ({weight:g})")

    @classmethod
    def of(cls, losses: Sequence[float] | LossCurve) -> LossCurve:
        """``losses`` as a curve: a plain sequence is the loss of steps 1, 2, ..."""
        return losses if isinstance(losses, LossCurve) else cls(range(1, len(losses) + 1), list(losses))


def smooth_losses(values: Sequence[float], weight: float) -> list[float]:
    """TensorBoard's smoothing: an exponential moving average with weight ``weight`` on the past,
    divided by ``1 - weight**n`` so that the first points are not pulled towards 0."""
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing weight must be in [0, 1), got {weight}")
    out, average = [], 0.0
    for n, value in enumerate(values, start=1):
        average = weight * average + (1.0 - weight) * value
        out.append(average / (1.0 - weight**n))
    return out


def contact_sheet_size(
    num_frames: int, height: int, width: int, num_rows: int, *, scale: int = 2, with_losses: bool = True
) -> tuple[int, int]:
    """``(width, height)`` in pixels of a sheet of ``num_rows`` rows of ``num_frames`` frames."""
    sheet_w = PAD + num_frames * (width * scale + PAD)
    sheet_h = PAD + num_rows * (LABEL_HEIGHT + height * scale + PAD)
    if not with_losses:
        return sheet_w, sheet_h
    return max(sheet_w, PANEL_MIN_WIDTH + 2 * PAD), sheet_h + CURVE_HEIGHT + PAD


def loss_plot_area(sheet_size: tuple[int, int]) -> tuple[int, int, int, int]:
    """``(left, top, right, bottom)`` of the loss plot's axes on a sheet of ``sheet_size`` with a loss
    panel (the panel spans the sheet's bottom ``CURVE_HEIGHT`` pixels above ``PAD``)."""
    width, height = sheet_size
    return _plot_box((PAD, height - PAD - CURVE_HEIGHT, width - PAD, height - PAD))


def _plot_box(panel: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    left, top, right, bottom = panel
    m = PLOT_MARGIN
    return left + m["left"], top + m["top"], right - m["right"], bottom - m["bottom"]


def contact_sheet(
    rows: Sequence[tuple[str, np.ndarray]],
    losses: Sequence[float] | LossCurve | None = None,
    *,
    scale: int = 2,
) -> Image.Image:
    """The sheet as an RGB image: one row per ``(label, uint8 frames [T, H, W, 3])``, all of one shape,
    then (when ``losses`` is given) the loss plot: a :class:`LossCurve`, or the loss per logged step."""
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
        _draw_losses(sheet, LossCurve.of(losses), (PAD, top, size[0] - PAD, top + CURVE_HEIGHT))
    return sheet


def write_contact_sheet(
    path: str | Path,
    rows: Sequence[tuple[str, np.ndarray]],
    losses: Sequence[float] | LossCurve | None = None,
    *,
    scale: int = 2,
) -> Path:
    """Write :func:`contact_sheet` as a PNG at ``path``; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    contact_sheet(rows, losses, scale=scale).save(path, format="PNG")
    return path


def _nice_ticks(low: float, high: float, count: int = 5, *, integer: bool = False) -> list[float]:
    """About ``count`` round values (1, 2 or 5 x 10^k apart) within ``[low, high]``."""
    if not high > low:
        return [low]
    raw_step = (high - low) / max(1, count - 1)
    magnitude = 10 ** math.floor(math.log10(raw_step))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw_step)
    if integer:
        step = max(1, round(step))
    first = math.ceil(low / step - 1e-9) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def _draw_losses(sheet: Image.Image, curve: LossCurve, box: tuple[int, int, int, int]) -> None:
    draw = ImageDraw.Draw(sheet)
    left, top, right, bottom = box
    draw.rectangle(box, outline=INK)
    points = [(s, v) for s, v in zip(curve.steps, curve.raw) if math.isfinite(v)]
    if not points:
        draw.text((left + 4, top + 4), "loss: no finite values", fill=INK)
        return
    raw = list(curve.raw)
    draw.text(
        (left + 4, top + 2),
        f"loss over {len(raw)} logged steps: first {raw[0]:.4g}, last {raw[-1]:.4g}",
        fill=INK,
    )
    x0, y0, x1, y1 = _plot_box(box)
    values = [v for _, v in points] + [v for v in curve.smoothed or () if math.isfinite(v)]
    low, high = min(values), max(values)
    low, high = (low - 0.05 * (high - low), high + 0.05 * (high - low)) if high > low else (low - 1, high + 1)
    first, last = min(curve.steps), max(curve.steps)
    span = max(1, last - first)

    def at(step: float, value: float) -> tuple[float, float]:
        return x0 + (x1 - x0) * (step - first) / span, y1 - (y1 - y0) * (value - low) / (high - low)

    for tick in _nice_ticks(first, last, integer=True):
        x = at(tick, low)[0]
        draw.line([(x, y1), (x, y1 + 3)], fill=INK)
        _text_centered(draw, f"{tick:g}", x, y1 + 5)
    for tick in _nice_ticks(low, high):
        y = at(first, tick)[1]
        draw.line([(x0 - 3, y), (x0, y)], fill=INK)
        label = f"{tick:.3g}"
        draw.text((x0 - 5 - draw.textlength(label), y - 6), label, fill=INK)
    _text_centered(draw, "step", (x0 + x1) / 2, y1 + 17)
    _vertical_text(sheet, "loss", (left + 3, (y0 + y1) // 2))
    if len(points) > 1:
        draw.line([at(s, v) for s, v in points], fill=RAW, width=1)
    if curve.smoothed is not None:
        smooth = [at(s, v) for s, v in zip(curve.steps, curve.smoothed) if math.isfinite(v)]
        if len(smooth) > 1:
            draw.line(smooth, fill=SMOOTHED, width=2)
    draw.line([(x0, y0), (x0, y1), (x1, y1)], fill=INK)  # the axes, over the curves
    legend = [("raw", RAW, 1)] + ([(curve.smoothed_label, SMOOTHED, 2)] if curve.smoothed is not None else [])
    for i, (name, colour, width) in enumerate(legend):
        y = y0 + 4 + 12 * i
        x = x1 - 24 - max(draw.textlength(n) for n, _, _ in legend)
        draw.line([(x, y + 5), (x + 16, y + 5)], fill=colour, width=width)
        draw.text((x + 20, y), name, fill=INK)


def _text_centered(draw: ImageDraw.ImageDraw, text: str, x: float, top: float) -> None:
    draw.text((x - draw.textlength(text) / 2, top), text, fill=INK)


def _vertical_text(sheet: Image.Image, text: str, left_middle: tuple[int, int]) -> None:
    """``text`` turned a quarter left (read bottom to top), its left edge at ``left_middle``."""
    probe = ImageDraw.Draw(sheet)
    width = int(probe.textlength(text)) + 2
    label = Image.new("RGB", (width, 12), SHEET_BACKGROUND)
    ImageDraw.Draw(label).text((1, 0), text, fill=INK)
    turned = label.rotate(90, expand=True)
    sheet.paste(turned, (left_middle[0], left_middle[1] - turned.height // 2))
