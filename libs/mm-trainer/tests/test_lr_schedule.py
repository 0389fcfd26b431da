"""LR schedules: warmup then constant / linear / cosine, computed from their definitions."""

import math

import pytest
from mm_trainer.model.optim import lr_lambda


def test_warmup_is_linear_to_the_base_lr():
    assert [lr_lambda(s, kind="constant", warmup=4, total=10, min_ratio=0) for s in range(5)] == [
        0.25,
        0.5,
        0.75,
        1.0,
        1.0,
    ]


def test_cosine_decays_from_one_to_the_min_ratio():
    f = [lr_lambda(s, kind="cosine", warmup=0, total=10, min_ratio=0.1) for s in (0, 5, 10)]
    assert f[0] == pytest.approx(1.0)
    assert f[1] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f[2] == pytest.approx(0.1)


def test_linear_decays_to_the_min_ratio():
    assert lr_lambda(6, kind="linear", warmup=2, total=10, min_ratio=0.0) == pytest.approx(0.5)


def test_an_unknown_schedule_is_named_in_the_error():
    with pytest.raises(ValueError, match="training.lr_scheduler: unknown schedule 'step'"):
        lr_lambda(3, kind="step", warmup=0, total=10, min_ratio=0)
