"""What distillation adds, on :mod:`wan22_train.distill_toy`'s exact setting (``exact_setting``: two clips
per caption differing in one 2 x 2 block of one latent channel, at +-0.5, each the mean of a Gaussian of std
0.02 per value; PSNR in latent space; no fitted teacher, seconds on one thread):

- the teacher, that mixture's exact velocity, passes the check at 50 steps (worst 43.3 dB) and blends at
  4 (a sample 8.2 dB nearer the clips' average than either clip; 16% of fresh noises fail the check's
  criterion);
- a DMD2 student (the teacher with its posterior over the clips tilted by a small network that starts at
  zero: it and the critic start as the teacher, bit for bit; critic every step on batches of 64,
  generator every 2nd, 400 steps, its EMA at decay 0.99: ``EXACT_FOUR_STEP``) passes at 4 steps with no
  fresh noise failing (seeds 0-9; the check passed at every look every 50 steps from 200 for seeds 0-2);
- the same generator updates with the flow-matching loss in place of the distribution-matching term
  leave a blend (margins -5.7 to -16.8 dB, 15-18% of fresh noises failing, seeds 0-4): flow matching
  fits the exact velocity, the teacher.

The student fails the check with the distribution-matching gradient's sign flipped (every sample on one
clip) or a critic that does not learn (the teacher's blends). The convergence study of the WanDiT toy
with a fitted teacher (3200 distillation steps for 4 steps, minutes): benchmarks/wan_distill_quality.py,
benchmarks/README.md. 1 step: tests/test_wan_distill_one_step.py.
"""

from __future__ import annotations

import pytest
import torch
from wan22_train.distill_toy import (
    EXACT_FOUR_STEP,
    SHAPE,
    distil,
    distillation,
    exact_setting,
    fresh_check,
    passes,
    quality,
)

pytestmark = pytest.mark.slow


def test_the_student_and_the_critic_start_as_the_exact_teacher():
    setting = exact_setting()
    container, _ = distillation(setting)
    x = torch.randn(8, *SHAPE, generator=torch.Generator().manual_seed(0))
    timestep, text = torch.linspace(3.0, 1000.0, 8), setting["captions"][torch.arange(8) % 2]
    teacher = container.teacher(x, timestep, text)
    for role in ("predictor", "critic"):
        model = getattr(container, role)
        assert any(p.requires_grad for p in model.parameters()), role
        assert torch.equal(model(x, timestep, text), teacher), role


def test_the_exact_teacher_passes_at_50_steps_and_blends_at_4():
    setting = exact_setting()
    container, dmd = distillation(setting)
    many, four = (quality(setting, container, dmd, "teacher", n) for n in (50, 4))
    assert passes(many), many
    assert not passes(four), four
    assert four["margin_db"] < -3, four  # -8.2 dB: a sample nearer the clips' average than either clip
    assert fresh_check(setting, container, dmd, "teacher", 4)["fail_share"] >= 0.1  # 16.1%


def test_a_dmd2_student_passes_at_4_steps(one_thread):
    setting = exact_setting()
    container, dmd = distil(setting, recipe=EXACT_FOUR_STEP)
    four = quality(setting, container, dmd, "predictor", 4)
    assert passes(four), four
    assert fresh_check(setting, container, dmd, "predictor", 4)["fail_share"] <= 0.01  # 0% (seeds 0-9)


def test_a_student_trained_with_flow_matching_instead_blends_at_4_steps(one_thread):
    setting = exact_setting()
    container, dmd = distil(setting, generator_loss="flow_matching", recipe=EXACT_FOUR_STEP)
    four = quality(setting, container, dmd, "predictor", 4)
    assert not passes(four), four
    assert four["margin_db"] < -3, four  # -5.7 to -16.8 dB
    assert fresh_check(setting, container, dmd, "predictor", 4)["fail_share"] >= 0.1  # 15-18%
