"""The Wan2.2 container: frozen ``ae`` and ``text_encoder``, trainable ``predictor``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mm_trainer import ModelContainer, model_register

from wan22_train.pipeline import LOW_NOISE_ROLE, Wan22Pipeline


@model_register("wan2_2_container")
class Wan22Container(ModelContainer):
    """Sub-models ``ae`` (Wan VAE), ``text_encoder`` (UMT5), ``predictor`` (Wan DiT) and, for
    ``expert: both``, ``predictor_low`` (the low-noise A14B expert).

    Only the predictor(s) train, switch to train mode and are checkpointed (one checkpoint holds
    both experts); the frozen parts reload from their pretrained sources on resume.
    """

    def __init__(self, sub_models: Mapping[str, Any], **kwargs: Any) -> None:
        self.checkpoint_submodels = tuple(n for n in ("predictor", LOW_NOISE_ROLE) if n in sub_models)
        super().__init__(sub_models, **kwargs)

    @classmethod
    def build_pipeline(cls, options: Mapping[str, Any]) -> Wan22Pipeline:
        return Wan22Pipeline.from_options(options)
