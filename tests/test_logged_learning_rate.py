"""The learning rate in ``metrics.jsonl`` is the one the step's update used: each record's ``lr`` equals the
schedule's formula at that step (linear warmup, then linear decay to ``min_lr``), written out here from
its definition rather than read from the trainer. It used to be the next step's (with 3 warmup steps:
0.00133 / 0.002 / 0.002 logged for steps that used 0.00067 / 0.00133 / 0.002)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

LR, MIN_LR, WARMUP, STEPS = 1e-2, 1e-3, 3, 8


def used_lr(step: int) -> float:
    """The rate of update ``step`` (1-based, as records count): ``step / warmup`` of the peak during warmup,
    then a straight line from the peak at update ``warmup + 1`` towards ``min_lr`` at update ``STEPS + 1``."""
    if step <= WARMUP:
        return LR * step / WARMUP
    progress = (step - 1 - WARMUP) / (STEPS - WARMUP)
    return MIN_LR + (LR - MIN_LR) * (1 - progress)


def test_each_logged_learning_rate_is_the_one_its_step_used_through_warmup_and_decay(
    toy_yaml, mm_train_forked
):
    training = {"train_iters": STEPS, "lr": LR, "min_lr": MIN_LR, "lr_warmup_iters": WARMUP,
                "lr_scheduler": "linear", "save_interval": 100}  # fmt: skip
    records = mm_train_forked(toy_yaml("lr", training=training))
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    logged = [r["lr"] for r in records]
    assert logged == pytest.approx([used_lr(s) for s in range(1, STEPS + 1)], rel=1e-6)
    assert logged[:WARMUP] == pytest.approx([LR / 3, 2 * LR / 3, LR])  # the warmup's first step is not 0
