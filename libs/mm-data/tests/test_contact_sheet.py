"""Contact sheets: labelled rows of frames and a loss curve, at the documented size."""

from __future__ import annotations

import numpy as np
import pytest
from mm_data import contact_sheet_size, write_contact_sheet
from mm_data.contact_sheet import CURVE_HEIGHT, LABEL_HEIGHT, PAD
from PIL import Image


def test_a_sheet_has_its_rows_of_frames_and_a_loss_panel_at_the_documented_size(tmp_path):
    red = np.zeros((3, 8, 10, 3), np.uint8)
    red[..., 0] = 255
    blue = np.zeros((3, 8, 10, 3), np.uint8)
    blue[..., 2] = 255
    path = write_contact_sheet(
        tmp_path / "sheet.png", [("red", red), ("blue", blue)], [3.0, 2.0, 1.0], scale=2
    )
    with Image.open(path) as image:
        assert image.format == "PNG"
        assert image.size == contact_sheet_size(3, 8, 10, 2, scale=2) == (4 + 3 * 24, 4 + 2 * 34 + 124)
        sheet = np.asarray(image.convert("RGB"))
    first_row_top = PAD + LABEL_HEIGHT
    second_row_top = first_row_top + 16 + PAD + LABEL_HEIGHT
    assert tuple(sheet[first_row_top + 1, PAD + 1]) == (255, 0, 0)
    assert tuple(sheet[second_row_top + 1, PAD + 2 * 24 + 1]) == (0, 0, 255)
    panel = sheet[-CURVE_HEIGHT - PAD :]
    assert (panel != 255).any()  # the curve and its frame are drawn


def test_a_sheet_without_losses_has_no_panel_and_rows_must_agree_in_shape(tmp_path):
    frames = np.zeros((2, 4, 4, 3), np.uint8)
    path = write_contact_sheet(tmp_path / "sheet.png", [("a", frames)], None, scale=1)
    with Image.open(path) as image:
        assert image.size == contact_sheet_size(2, 4, 4, 1, scale=1, with_losses=False)
    with pytest.raises(ValueError, match="one shape"):
        write_contact_sheet(tmp_path / "bad.png", [("a", frames), ("b", frames[:1])])
