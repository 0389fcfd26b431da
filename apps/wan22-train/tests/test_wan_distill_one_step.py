"""What distillation adds at 1 step, on :mod:`wan22_train.distill_toy`'s exact setting (``exact_setting``,
``EXACT_ONE_STEP``): a student that starts at sigma 0.3 from 0.3 x the noise (``distill.student_sigma_max``),
distribution matching at sigma <= 0.75 (``dm_range`` from 0.5), the generator every 2nd step, its EMA at
decay 0.99, 800 steps, passes the check at 1 step, where the teacher's one step from that start (margin
-13.1 dB, 23% of fresh noises failing the check's criterion) or from pure noise (every noise) is a blend,
and where the same generator updates with the flow-matching loss in place of the distribution-matching
term leave a blend (margins -11.9 to -28.1 dB, 22-24% failing, seeds 0-4).

Per fresh noise the student fails the criterion on 0.05-0.9% of its samples (seeds 0-9), and the check
passed at every look every 100 steps from 200 for seeds 0, 1, 2 and 9. The WanDiT toy's 1-step students
(12000 steps, minutes): benchmarks/wan_distill_quality.py --one-step, benchmarks/README.md.
"""

from __future__ import annotations

import pytest
from wan22_train.distill_toy import (
    EXACT_FOUR_STEP,
    EXACT_ONE_STEP,
    distil,
    distillation,
    exact_setting,
    fresh_check,
    passes,
    quality,
)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "recipe", [EXACT_ONE_STEP, EXACT_FOUR_STEP], ids=["from 0.3 x the noise", "from pure noise"]
)
def test_the_exact_teacher_blends_at_1_step_from_either_start(recipe):
    setting = exact_setting()
    container, dmd = distillation(setting, recipe=recipe)
    one = quality(setting, container, dmd, "teacher", 1)
    assert not passes(one), one
    assert one["margin_db"] < -3, one  # -13.1 / -133 dB
    assert fresh_check(setting, container, dmd, "teacher")["fail_share"] >= 0.15  # 23.1% / 100%


def test_a_dmd2_student_passes_at_1_step(one_thread):
    setting = exact_setting()
    container, dmd = distil(setting, recipe=EXACT_ONE_STEP)
    one = quality(setting, container, dmd, "predictor", 1)
    assert passes(one), one
    assert fresh_check(setting, container, dmd, "predictor")["fail_share"] <= 0.025  # 0.05-0.9% (seeds 0-9)


def test_a_1_step_student_trained_with_flow_matching_instead_blends(one_thread):
    setting = exact_setting()
    container, dmd = distil(setting, generator_loss="flow_matching", recipe=EXACT_ONE_STEP)
    one = quality(setting, container, dmd, "predictor", 1)
    assert not passes(one), one
    assert one["margin_db"] < -3, one  # -11.9 to -28.1 dB
    assert fresh_check(setting, container, dmd, "predictor")["fail_share"] >= 0.15  # 22-24%
