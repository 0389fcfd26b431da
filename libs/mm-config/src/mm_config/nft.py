"""``model.pipeline.nft``: the options of DiffusionNFT, shared by the models that train on their own rewarded
rollouts (their pipeline schemas hold it as ``nft``; docs/DESIGN.md "DiffusionNFT")."""

from __future__ import annotations

from pydantic import Field, model_validator

from .base import ConfigModel
from .errors import Problem, RuleViolations


class NFTOptions(ConfigModel):
    """``model.pipeline.nft``: DiffusionNFT (``mm_pipelines.DiffusionNFT``). Per prompt of the data, the old
    policy (an EMA of the trainable ``predictor``'s parameters; with ``expert: both`` also ``predictor_low``)
    samples ``group_size`` clips with the ODE sampler, ``training.rewards`` scores them, and the policy trains
    in the phase ``nft`` (``training.phases``) on the clean clips through the forward process: implicit
    positive and negative policies mixed from its own and the old policy's velocity, weighted by each clip's
    optimality probability, with a KL term to the reference (the frozen sub-model ``reference``, or, for a
    LoRA policy without one, the policy with its adapters off)."""

    group_size: int = Field(default=8, ge=2)
    """Clips sampled per prompt; each clip's advantage is its reward normalised within its prompt's group."""
    beta: float = Field(default=1.0, gt=0)
    """The implicit policies' mix: ``v+ = beta v + (1 - beta) v_old``, ``v- = (1 + beta) v_old - beta v``."""
    advantage_clip: float = Field(default=5.0, gt=0)
    """Advantages are clipped to ``[-advantage_clip, advantage_clip]`` and mapped to the optimality probability
    ``r = 1/2 + A / (2 advantage_clip)`` in ``[0, 1]``; the loss is scaled by ``advantage_clip / beta``."""
    kl_weight: float = Field(default=1e-4, ge=0)
    """Weight of ``mean (v - v_ref)^2``, the policy's velocity from the reference's (0: no reference forward)."""
    timestep_fraction: float = Field(default=0.5, gt=0, le=1)
    """Share of the sampler's sigmas trained at per optimizer step (``max(1, floor(fraction x steps))`` of
    them, one subset per step, keyed by the step), each with the forward process's noise."""
    sampling_steps: int = Field(default=10, ge=1)
    """Steps of the rollouts' ODE (Euler) sampler."""
    shift: float | None = Field(default=None, gt=0)
    """Time shift of the rollouts' sigma schedule; None: the pipeline's ``shift``."""
    old_decay_ramp: float = Field(default=1e-3, ge=0)
    """The old policy's EMA decay at optimizer step ``n`` is ``min(old_decay_ramp * n, old_decay_max)``."""
    old_decay_max: float = Field(default=0.5, ge=0, lt=1)
    """Largest EMA decay of the old policy (0: the old policy is the policy of the step's start)."""

    @model_validator(mode="after")
    def _decay_keys_act(self) -> NFTOptions:
        """A decay key set where the other makes it inert (the decay stays 0) is refused."""
        problems = []
        if self.old_decay_ramp == 0 and self.old_decay_max > 0 and "old_decay_max" in self.model_fields_set:
            problems.append(
                Problem(
                    ("old_decay_max",),
                    "is never reached: old_decay_ramp is 0, so the decay stays 0 (set old_decay_ramp > 0)",
                    self.old_decay_max,
                    deps=(("old_decay_ramp",),),
                )
            )
        if self.old_decay_max == 0 and self.old_decay_ramp > 0 and "old_decay_ramp" in self.model_fields_set:
            problems.append(
                Problem(
                    ("old_decay_ramp",),
                    "does nothing: old_decay_max is 0, so the decay stays 0 (remove old_decay_ramp, or raise "
                    "old_decay_max)",
                    self.old_decay_ramp,
                    deps=(("old_decay_max",),),
                )
            )
        if problems:
            raise RuleViolations(problems)
        return self
