"""Validation clips of a one-expert A14B run sample with the other expert (``predictor_other``),
switching at the expert boundary; without it, ``training.validation.prompts`` is refused."""

from __future__ import annotations

import pytest
import torch
from mm_config import load_config
from mm_trainer import ModelHub
from torch import nn
from wan22_train.configs import config_path
from wan22_train.container import Wan22Container
from wan22_train.pipeline import Wan22Pipeline
from wan22_train.tiny import make_tiny, tiny_overrides


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


def test_a_high_noise_run_samples_its_clip_with_the_frozen_low_noise_expert_below_the_boundary(tmp_path):
    tiny = make_tiny(tmp_path / "tiny")
    other = f"{{model_id: wan2_2_predictor, from_pretrained: {tiny / 'transformer'}, freeze: true}}"
    overrides = [
        *tiny_overrides(tiny),
        "model.pipeline.expert=high_noise",
        f"model.models.predictor_other={other}",
    ]
    config = load_config(config_path("tiny_t2v.yaml"), overrides, world_size=2, check_paths=True)
    subs = {name: ModelHub.build(args, meta_init=False) for name, args in config.model.sub_models().items()}
    model = Wan22Container(
        subs, trainable=("predictor",), pipeline=Wan22Pipeline.from_options(config.model.pipeline)
    )
    calls = {"predictor": 0, "predictor_other": 0}
    for name in calls:
        getattr(model, name).register_forward_hook(
            lambda *a, name=name: calls.__setitem__(name, calls[name] + 1)
        )
    video = model.sample(
        "a red ball", seed=3, num_frames=5, height=16, width=16, steps=6,
        guidance_scale=1.0, negative_prompt="", shift=5.0,
    )  # fmt: skip
    assert video.shape == (3, 5, 16, 16) and torch.isfinite(video).all()
    assert calls["predictor"] > 0 and calls["predictor_other"] > 0 and sum(calls.values()) == 6
