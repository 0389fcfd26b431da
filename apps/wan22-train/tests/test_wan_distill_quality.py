"""What distillation adds (:mod:`wan22_train.distill_toy`: two clips per caption, a teacher with 4 tokens
per clip, PSNR in latent space): the teacher's samples pass the quality check at 50 steps and are blends
at 1 and 4 steps; a DMD2 student (critic every step on batches of 64, generator every 10th, 3200 steps,
4-step schedule, its EMA at decay 0.999) passes at 4 steps, and fails the check's criterion on under
2.5% of fresh noises (1.3% measured at 3200 steps for 2 seeds); the same generator updates with the
flow-matching loss in place of the distribution-matching term leave a student that fails. At that share
all 32 of the check's samples pass in about 2 of 3 draws of 32 noises: the check passed at 10 of the 12
looks every 400 steps from 1200 to 3200 (2 seeds). Students distilled
for 1 step: tests/test_wan_distill_one_step.py; the numbers and sampling times:
benchmarks/wan_distill_quality.py, benchmarks/README.md."""

from __future__ import annotations

import pytest
from wan22_train.distill_toy import distil, distillation, fresh_check, passes, quality

pytestmark = pytest.mark.slow


def test_the_teacher_passes_at_many_steps_and_fails_at_1_and_4(distill_setting):
    container, dmd = distillation(distill_setting)
    many, one, four = (quality(distill_setting, container, dmd, "teacher", n) for n in (50, 1, 4))
    assert passes(many), many
    assert not passes(one), one
    assert not passes(four), four
    assert one["margin_db"] < 0 and four["margin_db"] < 0  # nearer the clips' average than either: blends


def test_the_distilled_student_passes_at_4_steps(distill_setting, one_thread):
    container, dmd = distil(distill_setting)
    four = quality(distill_setting, container, dmd, "predictor", 4)
    assert passes(four), four
    assert fresh_check(distill_setting, container, dmd, "predictor", 4)["fail_share"] <= 0.025


def test_a_student_trained_without_distribution_matching_fails_at_4_steps(distill_setting, one_thread):
    container, dmd = distil(distill_setting, generator_loss="flow_matching")
    four = quality(distill_setting, container, dmd, "predictor", 4)
    assert not passes(four), four
    assert four["margin_db"] < 0, four  # its worst sample is nearer the clips' average than either clip: a blend
