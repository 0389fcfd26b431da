"""Scoring a reward fine-tuning's rollouts (``model.pipeline.grpo``) with ``training.rewards``: the trainer
gives the pipeline a :class:`RolloutScorer` (:func:`attach_rollout_scorer`), which decodes the rollouts'
latents with the container's VAE only when a reward scores frames (and the pipeline's audio with the
container's ``decode_audio`` only when a reward scores audio), scores each group of clips of one prompt
together (groupwise rewards) and returns each clip's weighted-sum reward and the step's statistics.

Logged per step (averaged over the micro-batches and data-parallel ranks): ``reward`` (the mean weighted-sum
reward of the rollouts), ``reward_std`` (its spread within a micro-batch), ``reward_<id>`` (each reward's
mean) and, with ``training.reward_failure: skip``, ``reward_skipped`` (clips dropped in a micro-batch).

A reward that fails with ``reward_failure: stop`` on one rank's clips (each data-parallel rank scores its own
prompts' rollouts) ends the step on every rank alike: the ranks agree after scoring (one all-reduce of a flag
per call; every rank calls the scorer once per micro-batch) and each raises the same ``RewardError``, the
failing rank's message naming the reward and the clip, so that no rank waits for the failed one in the
step's later collectives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
import torch.distributed as dist

from mm_trainer.modes.rewards import RewardError, Rewards, RewardScores

Decode = Callable[[torch.Tensor], torch.Tensor]
"""``decode(latents [N, C, T, h, w]) -> frames [N, 3, F, H, W]`` in [-1, 1] (the container's VAE)."""
DecodeAudio = Callable[[torch.Tensor], tuple[torch.Tensor, int]]
"""``decode_audio(audio latents [N, ...]) -> (waveforms [N, channels, samples], sample rate)`` (the
container's audio decoder: LTX-2's)."""


class RolloutMode(Protocol):
    """A pipeline that samples and scores its own rollouts inside the step (``mm_pipelines.FlowGRPO``; a
    DiffusionNFT alike): what the trainer and the planner rely on.

    Each call of the pipeline (one micro-batch) samples ``group_size`` clips per prompt on
    ``sampling_steps`` sampler steps without gradients (the rollout), calls :attr:`scorer` once on the clips
    (the rewards), then computes the loss the backward runs (the update). The trainer fills the slot from
    ``training.rewards`` (:func:`attach_rollout_scorer`); the planner fills it with a scorer that also marks
    where the rollout ends and the update starts (``mm_trainer.planner.rollouts``).
    """

    scorer: Any
    group_size: int
    sampling_steps: int


def rollout_mode(model: Any) -> RolloutMode | None:
    """``model``'s pipeline when it samples and scores its own rollouts (it has a ``scorer`` slot), else None."""
    pipeline = getattr(model, "pipeline", None)
    return pipeline if pipeline is not None and hasattr(pipeline, "scorer") else None


class RolloutScorer:
    """``scorer(latents, prompts, groups=..., names=..., audio=...) -> (rewards [N], statistics)`` over
    ``rewards`` (``mm_pipelines.SampleScorer``); ``decode`` runs only when a reward needs frames,
    ``decode_audio`` only when one needs audio (the pipeline then passes the clips' audio latents:
    :attr:`needs_audio`)."""

    def __init__(
        self, rewards: Rewards, decode: Decode | None, decode_audio: DecodeAudio | None = None
    ) -> None:
        if rewards.needs_frames and decode is None:
            raise ValueError(
                f"training.rewards {rewards.ids} score decoded frames, and the model has no decode_latents "
                "(its VAE) to decode the rollouts with"
            )
        if rewards.needs_audio and decode_audio is None:
            raise ValueError(
                f"training.rewards {rewards.ids} score decoded audio, and the model has no decode_audio (an "
                "audio decoder: LTX-2 with model.pipeline.audio) to decode the rollouts' audio with"
            )
        self.rewards, self.decode, self.decode_audio = rewards, decode, decode_audio

    @property
    def needs_audio(self) -> bool:
        """Whether the pipeline must pass the clips' audio latents (``audio=``): a reward scores audio."""
        return self.rewards.needs_audio

    def scores(
        self, latents: torch.Tensor, prompts: Sequence[str], *, groups: Sequence[int], names: Sequence[str],
        audio: torch.Tensor | None = None,
    ) -> RewardScores:  # fmt: skip
        """Every reward's scores of the clips, decoded first when a reward scores frames or audio."""
        frames = self.decode(latents) if self.rewards.needs_frames and self.decode else None
        waves, rate = None, None
        if self.rewards.needs_audio and self.decode_audio is not None:
            if audio is None:
                raise ValueError(
                    f"training.rewards {self.rewards.ids} score audio, and the rollouts have none"
                )
            waves, rate = self.decode_audio(audio)
        return self.rewards.score(prompts, frames=frames, latents=latents, names=names, groups=groups,
                                  audio=waves, sample_rate=rate)  # fmt: skip

    @torch.no_grad()
    def __call__(
        self, latents: torch.Tensor, prompts: Sequence[str], *, groups: Sequence[int], names: Sequence[str],
        audio: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:  # fmt: skip
        try:
            scores = self.scores(latents, prompts, groups=groups, names=names, audio=audio)
        except RewardError as error:
            raise_on_every_rank(error, latents.device)
            raise
        raise_on_every_rank(None, latents.device)
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


def raise_on_every_rank(error: RewardError | None, device: torch.device) -> None:
    """Collective (every rank calls it once per scoring): when some rank's rewards failed, raise on every other
    rank a ``RewardError`` with the first failing rank's message (the failing rank raises its own after)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    failed = torch.tensor([1.0 if error is not None else 0.0], device=device)
    dist.all_reduce(failed)
    if not failed.item():
        return
    messages: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(messages, str(error) if error is not None else None)
    if error is None:
        rank, message = next((r, m) for r, m in enumerate(messages) if m is not None)
        raise RewardError(f"{message} (on rank {rank}; every rank stops)")


def prepare_rollout_decoding(
    model: Any, rewards: Rewards, *, data: Any, device: torch.device, planned: bool = False
) -> list[torch.nn.Module]:
    """When ``model``'s pipeline scores its own rollouts and a reward scores frames, let a container whose
    decoder is not one of its sub-models load it (its ``prepare_decoding(data=..., device=..., planned=...)``:
    LTX-2's video VAE, named by the data section) before :func:`attach_rollout_scorer`; ``planned``: built on
    meta for the planner, which materializes and counts the modules returned. The decoder's modules ([] when
    there is nothing to prepare)."""
    prepare = getattr(model, "prepare_decoding", None)
    wanted = {"frames": rewards.needs_frames, "audio": rewards.needs_audio}
    if rollout_mode(model) is not None and any(wanted.values()) and callable(prepare):
        return list(prepare(data=data, device=device, planned=planned, **wanted))
    return []


def attach_rollout_scorer(model: Any, rewards: Rewards) -> bool:
    """Give ``model``'s pipeline a :class:`RolloutScorer` over ``rewards`` when it scores its own rollouts
    (a pipeline with a ``scorer`` slot: ``mm_pipelines.FlowGRPO``, ``mm_pipelines.DiffusionNFT``); whether it does."""
    pipeline = rollout_mode(model)
    if pipeline is None:
        return False
    pipeline.scorer = RolloutScorer(
        rewards, getattr(model, "decode_latents", None), getattr(model, "decode_audio", None)
    )
    return True


__all__ = [
    "Decode",
    "DecodeAudio",
    "RolloutMode",
    "RolloutScorer",
    "attach_rollout_scorer",
    "prepare_rollout_decoding",
    "raise_on_every_rank",
    "rollout_mode",
]
