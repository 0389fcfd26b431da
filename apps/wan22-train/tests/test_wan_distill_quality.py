"""The premise of what distillation adds (:mod:`wan22_train.distill_toy`): the tiny teacher's samples pass
the quality check at 50 steps and fail it at 1 and 4 steps, on the student's schedule: few-step sampling
of a teacher with several tokens per clip and two clips per caption draws blends.

What the distilled student does in this setting (and a student trained without the distribution-matching
term) is measured by ``benchmarks/wan_distill_quality.py`` (table in benchmarks/README.md)."""

from __future__ import annotations

import pytest
from wan22_train.distill_toy import distillation, fit_teacher, passes, quality

pytestmark = pytest.mark.slow


def test_the_teacher_passes_at_many_steps_and_fails_at_1_and_4():
    setting = fit_teacher()
    container, dmd = distillation(setting)
    many, one, four = (quality(setting, container, dmd, "teacher", n) for n in (50, 1, 4))
    assert passes(many), many
    assert not passes(one), one
    assert not passes(four), four
    assert one["margin_db"] < 0  # closer to the average of the caption's clips than to either: a blend
