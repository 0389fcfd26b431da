"""Scoring a reward fine-tuning's rollouts (``model.pipeline.grpo``) with ``training.rewards``: the trainer
gives the pipeline a :class:`RolloutScorer` (:func:`attach_rollout_scorer`), which decodes the rollouts'
latents with the container's VAE only when a reward scores frames, scores each group of clips of one prompt
together (groupwise rewards) and returns each clip's weighted-sum reward and the step's statistics.

Logged per step (averaged over the micro-batches and data-parallel ranks): ``reward`` (the mean weighted-sum
reward of the rollouts), ``reward_std`` (its spread within a micro-batch), ``reward_<id>`` (each reward's
mean) and, with ``training.reward_failure: skip``, ``reward_skipped`` (clips dropped in a micro-batch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from mm_trainer.modes.rewards import Rewards

Decode = Callable[[torch.Tensor], torch.Tensor]
"""``decode(latents [N, C, T, h, w]) -> frames [N, 3, F, H, W]`` in [-1, 1] (the container's VAE)."""


class RolloutScorer:
    """``scorer(latents, prompts, groups=..., names=...) -> (rewards [N], statistics)`` over ``rewards``
    (``mm_pipelines.SampleScorer``); ``decode`` runs only when a reward needs frames."""

    def __init__(self, rewards: Rewards, decode: Decode | None) -> None:
        if "frames" in rewards.needs and decode is None:
            raise ValueError(
                f"training.rewards {rewards.ids} score decoded frames, and the model has no decode_latents "
                "(its VAE) to decode the rollouts with"
            )
        self.rewards, self.decode = rewards, decode

    @torch.no_grad()
    def __call__(
        self, latents: torch.Tensor, prompts: Sequence[str], *, groups: Sequence[int], names: Sequence[str]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        frames = self.decode(latents) if "frames" in self.rewards.needs and self.decode else None
        scores = self.rewards.score(prompts, frames=frames, latents=latents, names=names, groups=groups)
        kept = scores.kept
        total = scores.total[kept]
        logged = {
            "reward": float(total.mean()) if len(total) else float("nan"),
            "reward_std": float(total.std(unbiased=False)) if len(total) else float("nan"),
        }
        logged |= {f"reward_{rid}": float(v[kept].mean()) if len(total) else float("nan")
                   for rid, v in scores.each.items()}  # fmt: skip
        if self.rewards.on_failure == "skip":
            logged["reward_skipped"] = float((~kept).sum())
        return torch.where(kept, scores.total, torch.full_like(scores.total, torch.nan)), logged


def attach_rollout_scorer(model: Any, rewards: Rewards) -> bool:
    """Give ``model``'s pipeline a :class:`RolloutScorer` over ``rewards`` when it scores its own rollouts
    (a pipeline with a ``scorer`` slot: ``mm_pipelines.FlowGRPO``); whether it does."""
    pipeline = getattr(model, "pipeline", None)
    if pipeline is None or not hasattr(pipeline, "scorer"):
        return False
    pipeline.scorer = RolloutScorer(rewards, getattr(model, "decode_latents", None))
    return True


__all__ = ["Decode", "RolloutScorer", "attach_rollout_scorer"]
