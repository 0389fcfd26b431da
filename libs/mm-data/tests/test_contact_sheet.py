"""Contact sheets: labelled rows of frames and a loss plot with axes, at the documented size."""

from __future__ import annotations

import numpy as np
import pytest
from mm_data import LossCurve, contact_sheet_size, loss_plot_area, write_contact_sheet
from mm_data.contact_sheet import INK, LABEL_HEIGHT, PAD, PANEL_MIN_WIDTH, RAW, SMOOTHED
from PIL import Image


def _read(path) -> np.ndarray:
    with Image.open(path) as image:
        assert image.format == "PNG"
        return np.asarray(image.convert("RGB"))


def _where(pixels: np.ndarray, colour: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(rows, columns) of the pixels of ``colour``."""
    return np.nonzero((pixels == colour).all(-1))


def test_a_sheet_has_its_rows_of_frames_and_a_loss_panel_at_the_documented_size(tmp_path):
    red = np.zeros((3, 8, 10, 3), np.uint8)
    red[..., 0] = 255
    blue = np.zeros((3, 8, 10, 3), np.uint8)
    blue[..., 2] = 255
    path = write_contact_sheet(
        tmp_path / "sheet.png", [("red", red), ("blue", blue)], [3.0, 2.0, 1.0], scale=2
    )
    sheet = _read(path)
    # frames 4 + 3 x 24 wide, narrower than the loss panel's least width; 2 rows of 34, the panel of 184
    assert (
        sheet.shape[1::-1]
        == contact_sheet_size(3, 8, 10, 2, scale=2)
        == (PANEL_MIN_WIDTH + 8, 4 + 2 * 34 + 184)
    )
    first_row_top = PAD + LABEL_HEIGHT
    second_row_top = first_row_top + 16 + PAD + LABEL_HEIGHT
    assert tuple(sheet[first_row_top + 1, PAD + 1]) == (255, 0, 0)
    assert tuple(sheet[second_row_top + 1, PAD + 2 * 24 + 1]) == (0, 0, 255)


def test_the_loss_plot_has_axes_and_draws_the_loss_going_down_as_it_went(tmp_path):
    frames = np.zeros((2, 4, 4, 3), np.uint8)
    sheet = _read(write_contact_sheet(tmp_path / "sheet.png", [("a", frames)], [3.0, 2.0, 1.0], scale=1))
    left, top, right, bottom = loss_plot_area(sheet.shape[1::-1])
    assert (sheet[top:bottom, left] == INK).all() and (sheet[bottom, left:right] == INK).all()  # the axes
    assert (sheet[bottom + 4 : bottom + 30, left - 10 : right] != 255).any()  # step ticks, "step"
    assert (sheet[top:bottom, PAD + 2 : left - 4] != 255).any()  # loss ticks, "loss"
    rows, columns = _where(sheet[top:bottom, left + 1 : right], RAW)
    assert rows[columns == columns.min()].mean() < 0.1 * (bottom - top)  # step 1: 3.0, at the top
    assert rows[columns == columns.max()].mean() > 0.9 * (bottom - top)  # step 3: 1.0, at the bottom
    assert not _where(sheet, SMOOTHED)[0].size  # none given: no smoothed curve


def test_the_loss_plot_draws_a_smoothed_curve_over_the_raw_one_with_a_legend(tmp_path):
    frames = np.zeros((2, 4, 4, 3), np.uint8)
    raw = [2.0, 0.0] * 10  # zigzag; its moving average stays in the middle
    curve = LossCurve(range(10, 30), raw, [1.0] * 20, "smoothed (EMA 0.9)")
    sheet = _read(write_contact_sheet(tmp_path / "sheet.png", [("a", frames)], curve, scale=1))
    left, top, right, bottom = loss_plot_area(sheet.shape[1::-1])
    plot = sheet[top:bottom, left + 1 : right]
    raw_rows, _ = _where(plot, RAW)
    smooth_rows, smooth_columns = _where(plot, SMOOTHED)
    assert raw_rows.min() < 0.1 * (bottom - top) and raw_rows.max() > 0.9 * (bottom - top)
    # the flat 1.0 at mid-height (the median: the legend's short sample line is in the top right)
    assert abs(np.median(smooth_rows) - (bottom - top) / 2) <= 2
    assert np.ptp(smooth_columns) > 0.95 * (right - left - 1)  # from the first step to the last


def test_a_loss_curve_needs_one_value_of_each_per_step():
    with pytest.raises(ValueError, match="3 steps, 2 raw values and 0 smoothed ones"):
        LossCurve([1, 2, 3], [1.0, 2.0])
    with pytest.raises(ValueError, match="2 steps, 2 raw values and 1 smoothed ones"):
        LossCurve([1, 2], [1.0, 2.0], [1.0])


def test_a_sheet_without_losses_has_no_panel_and_rows_must_agree_in_shape(tmp_path):
    frames = np.zeros((2, 4, 4, 3), np.uint8)
    path = write_contact_sheet(tmp_path / "sheet.png", [("a", frames)], None, scale=1)
    with Image.open(path) as image:
        assert image.size == contact_sheet_size(2, 4, 4, 1, scale=1, with_losses=False) == (4 + 2 * 8, 4 + 22)
    with pytest.raises(ValueError, match="one shape"):
        write_contact_sheet(tmp_path / "bad.png", [("a", frames), ("b", frames[:1])])


def test_a_smoothed_curve_is_the_debiased_moving_average_named_by_its_weight():
    curve = LossCurve.smoothed_by([1, 2, 3], [4.0, 4.0, 1.0], 0.5)
    assert curve.smoothed == pytest.approx([4.0, 4.0, (0.5 * 3.0 + 0.5) / 0.875])  # no pull towards 0
    assert curve.smoothed_label == "smoothed (0.5)"
