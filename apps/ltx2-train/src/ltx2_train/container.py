"""The LTX-2 container: several LTX-2 transformers in one run (a distillation's student ``model``,
frozen ``teacher`` and fake-score ``critic``); ordinary training uses the single-model form."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mm_pipelines import DistributionMatchingDistillation, with_distillation
from mm_trainer import ModelContainer, model_register

from ltx2_train.distill import architecture_problems, check_models, distillation_pipeline
from ltx2_train.pipeline import LTX2Pipeline


@model_register("ltx2_container")
class LTX2Container(ModelContainer):
    """LTX-2 transformers by name, the one that trains as in the single-model form being ``model``.

    With ``model.pipeline.distill`` the container must hold ``model`` (the student), ``teacher``
    (frozen) and ``critic``; the trainable ones are checkpointed, the teacher reloads from its source.
    """

    def __init__(self, sub_models: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(sub_models, **kwargs)
        if isinstance(self.pipeline, DistributionMatchingDistillation):
            check_models(sub_models, self.trainable_submodels)

    @classmethod
    def sub_model_problems(cls, model_section: Any) -> dict[str, str]:
        """A distillation's student or critic whose architecture is not the teacher's
        (:func:`ltx2_train.distill.architecture_problems`), before anything is built."""
        return architecture_problems(model_section)

    @classmethod
    def build_pipeline(cls, options: Mapping[str, Any]) -> LTX2Pipeline | DistributionMatchingDistillation:
        """``LTX2Pipeline``; with ``distill``, DMD2 around it (:mod:`ltx2_train.distill`)."""
        return with_distillation(options, LTX2Pipeline.from_options, distillation_pipeline)

    @property
    def flow_pipeline(self) -> LTX2Pipeline:
        """The flow-match pipeline (under a distillation's, the one it wraps)."""
        return getattr(self.pipeline, "base", self.pipeline)

    def planning_batch(self, data: Any, micro_batch_size: int) -> dict[str, Any]:
        """A micro-batch of the run's real shapes for ``mm-train plan`` (:mod:`ltx2_train.planning`)."""
        return self.flow_pipeline.planning_batch(self, data, micro_batch_size)
