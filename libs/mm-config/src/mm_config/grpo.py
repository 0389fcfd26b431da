"""``model.pipeline.grpo``: the options of Flow-GRPO, shared by the models that train on their own rewarded
rollouts (their pipeline schemas hold it as ``grpo``; docs/DESIGN.md "Flow-GRPO")."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import ConfigModel


class GRPOOptions(ConfigModel):
    """``model.pipeline.grpo``: Flow-GRPO (``mm_pipelines.FlowGRPO``). Per prompt of the data, the policy (the
    trainable ``predictor``; with ``expert: both`` also ``predictor_low``) samples ``group_size`` clips as an
    SDE, ``training.rewards`` scores them, and the policy trains in the phase ``grpo`` (``training.phases``)
    on their group-normalised rewards with a clipped importance ratio and a KL term to the reference (the
    frozen sub-model ``reference``, or, for a LoRA policy without one, the policy with its adapters off)."""

    group_size: int = Field(default=8, ge=2)
    """Clips sampled per prompt; each clip's advantage is its reward normalised within its prompt's group."""
    noise_level: float = Field(default=0.7, gt=0)
    """``a`` of the SDE sampler's diffusion coefficient ``a * sqrt(s / (1 - s))``: how far the rollouts
    explore around the ODE sampler (0 would be the ODE itself, which has no transition density)."""
    clip_range: float = Field(default=1e-4, gt=0)
    """The importance ratio of the policy to the rollout's policy is clipped to ``[1 - clip_range,
    1 + clip_range]`` (at the first update of a rollout the ratio is 1 up to the numerics of the two forwards;
    it departs from 1 at the further ``updates_per_rollout``)."""
    advantage_clip: float = Field(default=5.0, gt=0)
    """Advantages are clipped to ``[-advantage_clip, advantage_clip]``."""
    advantage_scale: Literal["group_std", "none"] = "group_std"
    """What a clip's reward less its group's mean reward is divided by: ``group_std``, the group's std
    (Flow-GRPO: every group's advantages have unit size, so a group whose rewards differ only by noise
    pushes the policy as hard as one whose clips differ in what the reward asks for); ``none``, nothing
    (Dr. GRPO, Liu et al. 2025: advantages in the reward's units, a group of nearly equal rewards moves
    the policy little). Both are per group, so the same at any layout."""
    kl_weight: float = Field(default=0.04, ge=0)
    """Weight of the KL of the policy's transitions from the reference's (0: no KL, no reference forward)."""
    timestep_fraction: float = Field(default=0.5, gt=0, le=1)
    """Share of the sampler's steps trained on at each optimizer step (``max(1, floor(fraction x steps))``
    of them, one subset per step, keyed by the step)."""
    sampling_steps: int = Field(default=10, ge=2)
    """Steps of the rollouts' SDE sampler."""
    shift: float | None = Field(default=None, gt=0)
    """Time shift of the rollouts' sigma schedule; None: the pipeline's ``shift``."""
    guidance_scale: float = Field(default=1.0, ge=0)
    """Classifier-free guidance of the rollouts' velocity, ``v_u + g (v_c - v_u)``, and so of the trained
    steps' log-probabilities (the same guided velocity); != 1 needs ``negative_prompt_embeds`` in the batch
    or a text encoder (``negative_prompt``)."""
    negative_prompt: str = ""
    """The unconditional prompt of the rollouts' guidance, encoded by the text encoder."""
    updates_per_rollout: int = Field(default=1, ge=1)
    """Optimizer steps trained on each rollout: optimizer step ``t`` rolls out its prompts when ``t`` is a
    multiple of it, and the next ``updates_per_rollout - 1`` steps train on those rollouts again (the ratio to
    the rollout's policy departs from 1 and the clip binds); their own data batches are read and not used.
    ``training.save_interval`` and ``training.train_iters`` must be multiples of it (a run resumes at a
    rollout step only)."""
