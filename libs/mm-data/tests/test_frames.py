import numpy as np
import pytest
from mm_data import check_frame_rule, frame_step, sample_frame_indices


def test_frame_rule_accepts_4k_plus_1_and_names_neighbours():
    check_frame_rule(49, "4k+1")
    check_frame_rule(1, "4k+1")
    check_frame_rule(50, None)
    with pytest.raises(ValueError, match="nearest valid values are 49 and 53"):
        check_frame_rule(50, "4k+1")
    with pytest.raises(ValueError, match="8k\\+1"):
        check_frame_rule(45, "8k+1")


def test_frame_step_from_fps_or_stride():
    assert frame_step(16.0, 8.0, None) == 2.0
    assert frame_step(24.0, None, 3) == 3.0
    assert frame_step(24.0, None, None) == 1.0
    with pytest.raises(ValueError, match="not both"):
        frame_step(24.0, 8.0, 2)


def test_start_and_center_offsets():
    assert sample_frame_indices(20, 5, 2.0, "start") == [0, 2, 4, 6, 8]
    assert sample_frame_indices(20, 5, 2.0, "center") == [5, 7, 9, 11, 13]
    assert sample_frame_indices(10, 4, 1.5, "start") == [0, 2, 3, 5]  # floor(k*1.5 + 0.5)


def test_random_offset_stays_in_range_and_keeps_the_step():
    rng = np.random.default_rng(0)
    starts = set()
    for _ in range(300):
        idx = sample_frame_indices(30, 5, 3.0, "random", rng)
        assert np.all(np.diff(idx) == 3) and idx[0] >= 0 and idx[-1] <= 29
        starts.add(idx[0])
    assert starts == set(range(0, 18))


def test_too_short_clip_is_an_error():
    with pytest.raises(ValueError, match="too short: needs 17 frames"):
        sample_frame_indices(5, 17, 1.0, "start")
