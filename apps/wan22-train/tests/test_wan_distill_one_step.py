"""What distillation adds at 1 step (:mod:`wan22_train.distill_toy`, ``ONE_STEP``): a student that starts
at sigma 0.3 from 0.3 x the noise (``distill.student_sigma_max``), distribution matching at sigma <= 0.75
(``dm_range`` from 0.5), the generator every 2nd step, its EMA at decay 0.999, 8000 steps, draws sharp
clips of every mode from nearly every noise in one step, where the teacher's one step from that start, or
from pure noise, draws blends from every noise, and where the same generator updates with the
flow-matching loss in place of the distribution-matching term leave a student that blends.

What it does not do reliably: pass the check on all 32 of its samples. Per fresh noise 2.3-3.1% of its
samples fail (partial blends, each token part of the way to the other clip; the teacher's own share at
50 steps is 0.05%, the 4-step student's about 1%), so all 32 pass in some runs and not in others (seeds,
or the step a run stops at): benchmarks/wan_distill_quality.py --one-step and benchmarks/README.md.
These tests assert what held in every run measured."""

from __future__ import annotations

import pytest
from wan22_train.distill_toy import FOUR_STEP, ONE_STEP, distil, distillation, fresh_check, passes, quality

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("recipe", [ONE_STEP, FOUR_STEP], ids=["from 0.3 x the noise", "from pure noise"])
def test_the_teacher_blends_at_1_step_from_either_start(distill_setting, recipe):
    container, dmd = distillation(distill_setting, recipe=recipe)
    one = quality(distill_setting, container, dmd, "teacher", 1)
    assert not passes(one), one
    assert one["sharp"] == 0, one


def test_a_student_distilled_for_1_step_draws_sharp_clips_of_every_mode_at_1_step(distill_setting, one_thread):
    container, dmd = distil(distill_setting, recipe=ONE_STEP)
    one = quality(distill_setting, container, dmd, "predictor", 1)
    assert one["sharp"] >= 30 and min(one["clips_drawn"]) > 0, one
    assert fresh_check(distill_setting, container, dmd, "predictor")["fail_share"] <= 0.05


def test_a_1_step_student_trained_without_distribution_matching_blends_at_1_step(distill_setting, one_thread):
    container, dmd = distil(distill_setting, generator_loss="flow_matching", recipe=ONE_STEP)
    one = quality(distill_setting, container, dmd, "predictor", 1)
    assert not passes(one), one
    assert fresh_check(distill_setting, container, dmd, "predictor")["fail_share"] >= 0.5
