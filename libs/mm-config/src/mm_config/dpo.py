"""``model.pipeline.dpo``: the options of Diffusion-DPO, shared by the models that train on preference pairs
(their pipeline schemas hold it as ``dpo``; docs/DESIGN.md "Diffusion-DPO")."""

from __future__ import annotations

from pydantic import Field

from .base import ConfigModel


class DPOOptions(ConfigModel):
    """``model.pipeline.dpo``: Diffusion-DPO (``mm_pipelines.DiffusionDPO``) on offline pairs (the
    ``video_pairs`` dataset: per prompt a preferred and a rejected clip). The policy is the trainable
    ``predictor`` (with ``expert: both`` also ``predictor_low``), trained in the phase ``dpo``
    (``training.phases``); the reference is the frozen sub-model ``reference`` (``reference_low``), or, for a
    LoRA policy without one, the policy with its adapters off."""

    beta: float = Field(default=2500.0, gt=0)
    """Scale of the implicit reward: the margin is ``-beta`` times the difference of the policy's and the
    reference's denoising-error gaps between the preferred and the rejected clip (Wallace et al.'s
    ``beta_dpo`` 5000 for SD1.5 is 2500 here: their script halves it)."""
