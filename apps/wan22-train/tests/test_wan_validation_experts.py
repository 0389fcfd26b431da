"""Validation clips of a one-expert A14B run sample with the other expert (``predictor_other``),
switching at the expert boundary; without it, ``training.validation.prompts`` is refused."""

from __future__ import annotations

import pytest
from torch import nn
from wan22_train.container import Wan22Container
from wan22_train.pipeline import Wan22Pipeline


def container(expert: str, *extra: str) -> Wan22Container:
    names = ("ae", "text_encoder", "predictor", *extra)
    return Wan22Container(
        {name: nn.Linear(1, 1) for name in names},
        trainable=("predictor",),
        pipeline=Wan22Pipeline.from_options({"expert": expert}),
    )


def test_a_one_expert_run_without_the_other_expert_cannot_sample_and_says_what_to_add():
    with pytest.raises(ValueError, match=r"expert=high_noise .* model.models.predictor_other"):
        container("high_noise").check_sampling()


@pytest.mark.parametrize(("expert", "high", "low"), [("high_noise", "predictor", "predictor_other"),
                                                     ("low_noise", "predictor_other", "predictor")])  # fmt: skip
def test_the_trained_and_the_other_expert_take_their_sides_of_the_t2v_boundary(expert, high, low):
    model = container(expert, "predictor_other")
    modules = model.sampling_modules()
    assert modules["predictor"] is getattr(model, high) and modules["predictor_low"] is getattr(model, low)
    assert modules["boundary_timestep"] == float(model.pipeline.scheduler.timesteps[417])  # 0.417 * N


def test_a_both_experts_run_samples_with_its_two_trained_experts():
    model = container("both", "predictor_low")
    modules = model.sampling_modules()
    assert modules["predictor_low"] is model.predictor_low
    assert modules["boundary_timestep"] == float(model.pipeline.scheduler.timesteps[417])


def test_a_whole_range_run_samples_with_its_predictor_alone():
    assert "predictor_low" not in container("all").sampling_modules()
