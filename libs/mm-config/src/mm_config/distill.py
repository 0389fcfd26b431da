"""``model.pipeline.distill``: the options of few-step distillation (DMD2), shared by the models that
distil (their pipeline schemas hold it as ``distill``; docs/DESIGN.md "Few-step distillation")."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import ConfigModel


class DistillOptions(ConfigModel):
    """``model.pipeline.distill``: few-step distillation by distribution matching (DMD2,
    ``mm_pipelines.DistributionMatchingDistillation``). The container then holds a frozen ``teacher``, the
    student and the fake-score ``critic``, trained in the phases ``critic`` and ``generator``
    (``training.phases``). A model's schema may extend it (its own keys) or narrow it (a rule)."""

    student_steps: int = Field(default=4, ge=1)
    """Euler steps of the student's schedule (``sample --steps`` at ``student_shift`` draws it)."""
    student_shift: float | None = Field(default=None, gt=0)
    """Time shift of the student's schedule; None: the pipeline's ``shift``."""
    student_sigma_max: float = Field(default=1.0, gt=0, le=1)
    """The noise level of the student's first step: it starts from this sigma times the noise (1: pure
    noise; below 1, as Score identity Distillation's one-step generator, where the teacher's denoiser
    already separates the modes: a 1-step student learns a sharp split sooner)."""
    guidance_scale: float = Field(default=1.0, ge=0)
    """Classifier-free guidance of the teacher's (real) prediction; != 1 needs ``negative_prompt_embeds``
    in the batch or a text encoder (``negative_prompt``)."""
    negative_prompt: str = ""
    """The unconditional prompt of the teacher's guidance, encoded once by the text encoder."""
    teacher_steps: int = Field(default=50, ge=1)
    """Euler steps of the teacher's reference clips in validation (``val_psnr_to_reference``)."""
    dm_range: list[float] = Field(default=[0.02, 0.98], min_length=2, max_length=2)
    """Fractions of the grid between which the distribution-matching / critic timesteps are drawn."""
    generator_loss: Literal["distribution_matching", "flow_matching"] = "distribution_matching"
    """The generator phase's loss: ``distribution_matching`` (DMD), or ``flow_matching`` at the student's
    timesteps (the ablation without distribution matching)."""
