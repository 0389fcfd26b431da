"""``training.validation`` asks the model for hooks (a model without them is refused before training)
and logs its clips to TensorBoard."""

from __future__ import annotations

import pytest
import torch
from mm_config import ValidationConfig
from mm_trainer import MetricsLogger, ModelContainer, Validator
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn


def _validator(model: nn.Module, **section) -> Validator:
    return Validator(
        model, ValidationConfig(**section), data=None, seed=0, out_dir="unused", device=torch.device("cpu")
    )


def test_prompts_are_refused_for_a_model_that_cannot_sample():
    model = ModelContainer({"predictor": nn.Linear(2, 2)}, trainable=("predictor",))
    with pytest.raises(ValueError, match=r"training.validation.prompts: ModelContainer has no sample\("):
        _validator(model, prompts=["a red square"])


def test_held_out_data_is_refused_for_a_model_whose_pipeline_has_no_validation_loss():
    model = ModelContainer({"predictor": nn.Linear(2, 2)}, trainable=("predictor",))
    with pytest.raises(
        ValueError, match=r"training.validation.data_path: ModelContainer computes no held-out"
    ):
        _validator(model, data_path="held_out.json")


def test_a_validation_clip_goes_to_tensorboard_as_its_frames(tmp_path):
    metrics = MetricsLogger(total_steps=10, log_dir=tmp_path, tensorboard=True)
    metrics.add_video("validation/0", torch.rand(3, 5, 8, 6) * 2 - 1, step=10)
    metrics.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"images": 0}).Reload()
    images = events.Images("validation/0")
    assert [(i.step, i.height, i.width) for i in images] == [(10, 8, 6 * 5)]  # the 5 frames side by side
