"""Planning a step that samples and scores its own rollouts (a rollout mode, ``model.pipeline.grpo``:
:class:`~mm_trainer.modes.rollout_scoring.RolloutMode`).

Such a step runs in three stages within each micro-step, all traced by the pipeline's own code:

1. **rollout**: the prompts' conditions, then ``group_size`` clips per prompt sampled on ``sampling_steps``
   steps of the policy without gradients (every state of the sampler held for the update);
2. **rewards**: the scorer of ``training.rewards`` (:class:`PlannedScorer`, the trainer's
   :class:`~mm_trainer.modes.rollout_scoring.RolloutScorer`): the VAE decode of the clips when a reward
   scores frames (a VAE outside the container, ``prepare_decoding``'s, built on meta and counted too), then every reward's forward (a reward's model, built on meta by its ``planned``
   classmethod and materialized as fake tensors, counted in the parameters for the whole step);
3. **update**: the loss's forwards (the trained steps, the reference's for the KL: for a LoRA policy the
   base with its adapters off, no copy) and the backward.

The scorer marks where the rewards start and end, so that each stage is a part of the trace of its own
(``micro-step 1/1 (grpo, rollout)``, ``... rewards)``, ``... update)``): the peak is the largest of the
three, the step time their sum. The rewards' values are not read (the scorer returns zeros: advantages'
values change no shape), nor are the rollout's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from mm_config import TrainConfig

from mm_trainer.modes.rewards import Rewards
from mm_trainer.modes.rollout_scoring import (
    RolloutMode,
    RolloutScorer,
    prepare_rollout_decoding,
    rollout_mode,
)
from mm_trainer.planner.cost_model import StepCost

STAGES = ("rollout", "rewards", "update")


def stage_part(label: str, stage: str) -> str:
    """The trace part of ``stage`` in the micro-step ``label``: ``micro-step 1/1 (grpo)`` ->
    ``micro-step 1/1 (grpo, rollout)`` (``(rollout)`` for a label without a phase)."""
    if label.endswith(")"):
        return f"{label[:-1]}, {stage})"
    return f"{label} ({stage})"


class PlannedScorer(RolloutScorer):
    """The trainer's rollout scorer on fake tensors (module docstring, 2.): the decode and every reward's
    forward run; the rewards returned are zeros. ``stage`` is told ``rewards`` as it starts and ``update``
    as it returns."""

    def __init__(
        self, rewards: Rewards, decode: Any, stage: Callable[[str], None], decode_audio: Any = None
    ) -> None:
        super().__init__(rewards, decode, decode_audio)
        self.stage = stage

    def __call__(
        self, latents: torch.Tensor, prompts: Sequence[str], *, groups: Sequence[int], names: Sequence[str],
        audio: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:  # fmt: skip
        self.stage("rewards")
        with torch.no_grad():
            self.scores(latents, prompts, groups=groups, names=names, audio=audio)
        self.stage("update")
        return torch.zeros(len(prompts), dtype=torch.float64, device=latents.device), {}


@dataclass
class RolloutPlan:
    """A rollout mode's pipeline and its rewards (built for planning), and the micro-step being traced."""

    mode: RolloutMode
    rewards: Rewards
    decoders: Sequence[torch.nn.Module] = ()
    label: str = ""

    def modules(self) -> list[torch.nn.Module]:
        """The rewards' models and a decoder outside the container (LTX-2's video VAE): materialized and
        counted beside the container's."""
        return [*self.rewards.modules(), *self.decoders]

    def attach(self, model: Any, set_part: Callable[[str], None]) -> None:
        """Give the pipeline a :class:`PlannedScorer` whose stages name the parts through ``set_part``."""
        decode, decode_audio = getattr(model, "decode_latents", None), getattr(model, "decode_audio", None)
        self.mode.scorer = PlannedScorer(
            self.rewards, decode, lambda stage: set_part(stage_part(self.label, stage)), decode_audio
        )

    def start(self, label: str) -> str:
        """The part a micro-step ``label`` starts in: its rollout."""
        self.label = label
        return stage_part(label, "rollout")

    def describe(self, micro_batch_size: int) -> str:
        """One line for the report: what a micro-step samples, scores and trains."""
        clips = micro_batch_size * self.mode.group_size
        frames = "decoded by the VAE, " if self.rewards.needs_frames else ""
        frames += "audio decoded, " if self.rewards.needs_audio else ""
        ids = ", ".join(self.rewards.ids) or "none"
        return (
            f"rollouts: {self.mode.group_size} clips x {micro_batch_size} prompt(s) = {clips} clips per micro-step, "
            f"{self.mode.sampling_steps} sampler steps without gradients, {frames}scored by {ids}; then the update"
        )


def stage_seconds(parts: dict[str, StepCost], accumulation: int) -> dict[str, float]:
    """Seconds of each stage over the optimizer step (its first micro-step ``accumulation - 1`` times, its
    last once, as ``TracedRun.step_cost`` counts them), from a trace's ``parts``; empty without stages."""
    out: dict[str, float] = {}
    for stage in STAGES:
        micro = [
            c for name, c in parts.items() if name.startswith("micro-step") and name.endswith(f", {stage})")
        ]
        if micro:
            total = micro[0].scaled(accumulation - 1) + micro[-1] if len(micro) > 1 else micro[0]
            out[stage] = total.step_seconds()
    return out


def planned_rollouts(model: Any, config: TrainConfig) -> RolloutPlan | None:
    """The rollout plan of ``model`` when its pipeline is a rollout mode (its rewards built as the planner
    traces them: ``Rewards.from_config(planned=True)``), else None."""
    mode = rollout_mode(model)
    if mode is None:
        return None
    training = config.training
    rewards = Rewards.from_config(training.rewards, on_failure=training.reward_failure, planned=True)
    meta = torch.device("meta")
    decoders = prepare_rollout_decoding(model, rewards, data=config.data, device=meta, planned=True)
    return RolloutPlan(mode, rewards, decoders)


__all__ = ["STAGES", "PlannedScorer", "RolloutPlan", "planned_rollouts", "stage_part", "stage_seconds"]
