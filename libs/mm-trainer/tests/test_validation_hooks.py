"""``training.validation`` asks the model for hooks; a model without them is refused before training."""

from __future__ import annotations

import pytest
import torch
from mm_config import ValidationConfig
from mm_trainer import ModelContainer, Validator
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
