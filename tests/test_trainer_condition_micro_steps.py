"""features.condition_micro_steps end to end on the toy plugin: the same training, and resumes mid-group.

Runs are mm-train's ``main`` on forked gloo ranks (``mm_train_forked``)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def losses(records: list[dict]) -> list[float]:
    return [r["loss"] for r in records]


def test_conditions_encoded_two_micro_steps_ahead_train_exactly_like_one_at_a_time(toy_yaml, mm_train_forked):
    # world 2 with the encoder FSDP-sharded: every encode is collective, and ranks stay in step
    sections = {"training": {"train_iters": 8, "gradient_accumulation_steps": 2}}
    plain = toy_yaml("plain", **sections)
    ahead = toy_yaml("ahead", features={"condition_micro_steps": 4}, **sections)
    assert losses(mm_train_forked(ahead, nproc=2)) == losses(mm_train_forked(plain, nproc=2))


def test_a_checkpoint_taken_mid_group_resumes_with_the_uninterrupted_losses(toy_yaml, mm_train_forked):
    sections = {
        "training": {"train_iters": 9},
        "features": {
            "condition_micro_steps": 2
        },  # steps (1,2) (3,4) ...: the save after step 3 splits a group
        "model": {"pipeline": {"noise": "global"}},  # global RNG: reseeded per micro-batch from its key
        "data": {"dataset": {"num_samples": 20}},  # 5 steps an epoch: an epoch ends inside a group
    }
    reference = toy_yaml("reference", **sections)
    expected = losses(mm_train_forked(reference))

    first = toy_yaml("first", **sections)
    mm_train_forked(first, "training.train_iters=3")
    second = toy_yaml("second", **sections)
    resumed = mm_train_forked(second, f"training.load={first.parent / 'ckpt'}")
    assert [r["step"] for r in resumed] == list(range(4, 10))
    assert losses(resumed) == expected[3:]
