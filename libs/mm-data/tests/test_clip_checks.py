"""What a clip shows: PSNR, and whether a synthetic shape moves the way its caption says."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from mm_data import (
    VideoTextDataset,
    caption_direction,
    make_synthetic_dataset,
    moves_as_captioned,
    psnr,
    to_video_frames,
)
from mm_data.synthetic import _shape_frames


def test_psnr_is_the_8_bit_psnr_of_videos_in_minus_one_to_one():
    a = torch.zeros(3, 2, 4, 4)
    b = a + 2 * 0.1  # 10 % of the peak-to-peak range everywhere: 20 dB
    assert psnr(b, a) == pytest.approx(20.0, abs=1e-4)
    assert psnr(a, a) == float("inf")
    with pytest.raises(ValueError, match="shapes differ"):
        psnr(a, a[:, :1])


def test_caption_direction_reads_the_one_direction_word():
    assert caption_direction("a red square moving left") == (-1, 0)
    assert caption_direction("A blue circle slides up across a dark grey background.") == (0, -1)
    with pytest.raises(ValueError, match="exactly one of"):
        caption_direction("a red square")


@pytest.mark.parametrize("direction", ["left", "right", "up", "down"])
def test_a_synthetic_clip_moves_as_its_caption_says_and_not_the_other_way(direction):
    frames = _shape_frames(32, 32, 9, "red", "circle", direction)
    assert moves_as_captioned(frames, f"a red circle moving {direction}")
    assert not moves_as_captioned(frames[::-1], f"a red circle moving {direction}")


def test_noise_and_empty_frames_do_not_move_as_captioned():
    rng = np.random.default_rng(0)
    assert not moves_as_captioned(
        rng.integers(0, 256, (9, 32, 32, 3), dtype=np.uint8), "a red circle moving left"
    )
    background = np.full((9, 32, 32, 3), 40, np.uint8)
    assert not moves_as_captioned(background, "a red circle moving left")


def test_decoded_synthetic_clips_move_as_their_captions_say(tmp_path):
    meta = make_synthetic_dataset(tmp_path, num_clips=4, sizes=((32, 32),), fps=(8,), num_frames=(9,))
    dataset = VideoTextDataset(meta, num_frames=9, height=32, width=32)
    for row, i in zip(json.loads(meta.read_text()), range(4), strict=True):
        frames = ((dataset[i]["video"].permute(1, 2, 3, 0) + 1) * 127.5).round().byte().numpy()
        assert moves_as_captioned(frames, row["cap"][0]), row["cap"][0]


def test_to_video_frames_inverts_to_video_tensor():
    from mm_data import to_video_tensor

    frames = np.random.default_rng(0).integers(0, 256, (3, 4, 6, 3), dtype=np.uint8)
    assert np.array_equal(to_video_frames(to_video_tensor(frames)), frames)
    with pytest.raises(ValueError, match=r"\[3, T, H, W\]"):
        to_video_frames(torch.zeros(4, 3, 4, 6))


def test_synthetic_clips_can_be_fixed_to_given_shapes_and_directions(tmp_path):
    shapes = [("white", "circle", "up"), ("white", "circle", "left")]
    meta = make_synthetic_dataset(
        tmp_path, num_clips=2, sizes=((32, 32),), fps=(8,), num_frames=(9,), shapes=shapes
    )
    rows = json.loads(meta.read_text())
    assert [row["cap"][0] for row in rows] == ["a white circle moving up", "a white circle moving left"]
    dataset = VideoTextDataset(meta, num_frames=9, height=32, width=32)
    assert moves_as_captioned(to_video_frames(dataset[1]["video"]), "a white circle moving left")
    with pytest.raises(ValueError, match="'purple'"):
        make_synthetic_dataset(tmp_path / "bad", num_clips=1, shapes=[("purple", "circle", "up")])
