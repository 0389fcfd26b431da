"""The Wan2.2 container: frozen ``ae`` and ``text_encoder``, trainable ``predictor``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mm_trainer import ModelContainer, model_register

from wan22_train.pipeline import Wan22Pipeline


@model_register("wan2_2_container")
class Wan22Container(ModelContainer):
    """Sub-models ``ae`` (Wan VAE), ``text_encoder`` (UMT5) and ``predictor`` (Wan DiT).

    Only the predictor is trained, switched to train mode and checkpointed; the frozen parts
    reload from their pretrained sources on resume.
    """

    checkpoint_submodels = ("predictor",)

    @classmethod
    def build_pipeline(cls, options: Mapping[str, Any]) -> Wan22Pipeline:
        return Wan22Pipeline.from_options(options)
