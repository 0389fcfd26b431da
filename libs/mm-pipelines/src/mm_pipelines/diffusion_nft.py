"""DiffusionNFT (Zheng et al. 2025, "DiffusionNFT: Online Diffusion Reinforcement with Forward Process") around a
flow-match pipeline: the old policy samples ``G`` clips per prompt with the ODE sampler, a reward scores them,
and the policy (``predictor``) learns on the clean clips through the forward process in the phase ``nft``.

One optimizer step of the phase, per micro-batch of ``B`` prompts (each rank its own prompts):

1. **Old policy** (:class:`~mm_pipelines.old_policy.OldPolicyEMA`): an EMA of the policy's trainable
   parameters, brought to the step at its first micro-batch, ``decay_n = min(old_decay_ramp * n,
   old_decay_max)``; swapped into the policy for the rollouts and ``v_old`` below.
2. **Rollout** (no gradients): ``G`` clips per prompt, ``N = B * G``, with the old policy's ODE (Euler) sampler
   on ``sampling_steps`` sigmas at the time ``shift``; each clip's start noise keyed by (seed, optimizer step,
   the prompt's global sample index, group index ``g``) through ``SampleRNG`` (purpose ``nft_start_<g>``):
   the same clips at any data-parallel / context-parallel / accumulation layout.
3. **Rewards** from the trainer's scorer (:attr:`DiffusionNFT.scorer`, ``training.rewards``), then per group
   the advantage ``A`` of Flow-GRPO (``group_advantages``: normalised within the prompt's ``G`` clips,
   clipped to ``+-advantage_clip``) and the optimality probability ``r = 1/2 + A / (2 advantage_clip)`` in
   ``[0, 1]``. A clip dropped by ``reward_failure: skip`` (NaN reward) gets weight 0 in the loss.
4. **Loss**, at ``max(1, floor(timestep_fraction * K))`` of the sampler's sigmas ``t = s_k`` (one keyed subset
   per optimizer step, as Flow-GRPO's: with both A14B experts each runs the expert of its sigma): the clean
   clip ``x0`` is noised by the forward process ``x_t = (1 - t) x0 + t eps`` (``eps`` keyed by sample, group
   index and ``k``: ``nft_noise_<k>_<g>``); with the policy's velocity ``v`` (gradients), the old policy's
   ``v_old`` and ``beta``, the implicit positive and negative policies

       v+ = beta v + (1 - beta) v_old,        v- = (1 + beta) v_old - beta v

   predict ``x0+- = x_t - t v+-``; each is scored by the adaptively weighted error
   ``L+- = mean((x0+- - x0)^2) / sg(mean|x0+- - x0|)`` (``sg``: no gradient; the mean absolute error at least
   ``1e-5``), and

       policy loss = advantage_clip * mean_clips[(r L+ + (1 - r) L-) / beta]
       KL          = mean_clips mean_elements (v - v_ref)^2

   (``v_ref``: the frozen reference's velocity, the sub-model ``reference`` or the LoRA policy with its
   adapters off; computed only when ``kl_weight > 0``); the loss is the mean over the chosen sigmas of
   ``policy loss + kl_weight * KL``. Minimising ``r L+ + (1 - r) L-`` moves ``v+`` toward the clips of high
   ``r`` and ``v-`` toward those of low ``r``: the policy moves away from the negative clips. The factor
   ``advantage_clip / beta`` follows the public implementation (the loss's scale at any ``beta``).

**Streams** (a flow state of several, LTX-2's ``video`` and ``audio``): the rollout moves every stream
together, each with start noise and forward-process noise of its own (``nft_start_<stream>_<g>``,
``nft_noise_<k>_<stream>_<g>`` for the streams after the first: :mod:`.group_rollouts`); ``L+-`` is the
streams' sum of their own adaptively weighted errors, each weighted by the base's ``state_weights`` (LTX-2:
the audio's ``audio_loss_weight``, as the training loss), and the KL and ``nft_old_deviation`` are means over
every element of every stream. With one stream (Wan) every number is the one-stream formula's.

Logged per step: the scorer's reward statistics, ``nft_kl`` (the KL term, 0 without it),
``nft_old_deviation`` (``mean (v - v_old)^2``: how far the policy is from its old policy) and
``nft_old_decay`` (the EMA decay of the step).

The old policy is this object's state (:meth:`DiffusionNFT.state_dict`): the trainer checkpoints it per
data-parallel rank (its ``pipeline`` entry), so a resumed run continues the same old policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .distribution_matching import weighted_streams
from .flow_grpo import group_advantages
from .flow_match_scheduler import FlowMatchScheduler
from .group_rollouts import (
    SampleScorer,
    check_call,
    clean_flow,
    clip_groups,
    clip_names,
    clip_prompts,
    keyed_steps,
    repeat_conditions,
    rollout_sigmas,
    score_clips,
    state_device,
    stream_noise,
)
from .keyed_random import SampleRNG
from .old_policy import OldPolicyEMA
from .pipeline_base import PipelineOutput
from .preference import as_reference
from .rollout import Flow, element_mean, ode_rollout

WEIGHT_FLOOR = 1e-5
"""Least value of the adaptive weight ``mean|x0_pred - x0|`` (a perfect prediction divides by it)."""


def optimality_probability(advantages: torch.Tensor, clip: float) -> torch.Tensor:
    """``r = 1/2 + A / (2 clip)``, clamped to ``[0, 1]``: a clipped advantage as DiffusionNFT's optimality
    probability."""
    return (0.5 + advantages / (2 * clip)).clamp(0.0, 1.0)


def nft_policy_loss(
    velocity: torch.Tensor, old_velocity: torch.Tensor, x_t: torch.Tensor, x0: torch.Tensor, t: torch.Tensor,
    r: torch.Tensor, beta: float,
) -> torch.Tensor:  # fmt: skip
    """``[N]``: each clip's ``(r L+ + (1 - r) L-) / beta`` (module docstring, 4.) from the policy's velocity
    (differentiable), the old policy's, the noised ``x_t``, the clean ``x0`` (all ``[N, ...]``), the sigmas
    ``t`` ``[N]`` and the optimality probabilities ``r`` ``[N]``."""
    old = old_velocity.detach().float()
    velocity, x_t, x0 = velocity.float(), x_t.float(), x0.float()
    t = t.float().view(-1, *([1] * (x0.dim() - 1)))
    positive = beta * velocity + (1 - beta) * old
    negative = (1 + beta) * old - beta * velocity
    losses = [_weighted_error(x_t - t * v, x0) for v in (positive, negative)]
    r = r.to(losses[0].dtype)
    return (r * losses[0] + (1 - r) * losses[1]) / beta


def _weighted_error(prediction: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """``[N]``: ``mean((prediction - x0)^2) / sg(max(mean|prediction - x0|, WEIGHT_FLOOR))`` per clip."""
    error = (prediction - x0).flatten(1)
    weight = error.detach().abs().mean(dim=1).clamp(min=WEIGHT_FLOOR)
    return (error**2).mean(dim=1) / weight


class DiffusionNFT:
    """DiffusionNFT in the phase ``nft`` on a flow-match pipeline ``base`` with ``prepare_conditions`` and
    ``state_velocity`` (:class:`~mm_pipelines.FlowMatchT2VPipeline`, text-to-video)."""

    def __init__(
        self,
        base: Any,
        *,
        group_size: int = 8,
        beta: float = 1.0,
        advantage_clip: float = 5.0,
        kl_weight: float = 1e-4,
        timestep_fraction: float = 0.5,
        sampling_steps: int = 10,
        shift: float | None = None,
        old_decay_ramp: float = 1e-3,
        old_decay_max: float = 0.5,
        phase: str = "nft",
    ) -> None:
        _check(group_size, beta, advantage_clip, kl_weight, timestep_fraction, sampling_steps)
        if getattr(base, "task", "t2v") != "t2v":
            raise ValueError(f"nft: rollouts are text-to-video only (task t2v), got task {base.task!r}")
        self.base, self.phase, self.group_size = base, phase, int(group_size)
        self.beta, self.advantage_clip, self.kl_weight = float(beta), float(advantage_clip), float(kl_weight)
        self.timestep_fraction, self.sampling_steps = float(timestep_fraction), int(sampling_steps)
        self.sigmas = rollout_sigmas(base.scheduler, self.sampling_steps, shift)
        self.old_policy = OldPolicyEMA(decay_ramp=old_decay_ramp, decay_max=old_decay_max)
        self.scorer: SampleScorer | None = None

    @classmethod
    def from_options(cls, base: Any, options: Mapping[str, Any]) -> DiffusionNFT:
        """From the keys of ``model.pipeline.nft`` (``mm_config.NFTOptions``) around ``base``."""
        return cls(base, **dict(options))

    @property
    def scheduler(self) -> FlowMatchScheduler:
        return self.base.scheduler

    @property
    def trained_steps(self) -> int:
        """How many of the sampler's sigmas each optimizer step trains at."""
        return max(1, int(self.timestep_fraction * self.sampling_steps))

    def train_steps(self, rng: SampleRNG) -> list[int]:
        """The sampler steps whose sigmas this optimizer step trains at, keyed by the step."""
        return keyed_steps(rng, "nft_timesteps", self.trained_steps, self.sampling_steps)

    # ------------------------------------------------------------------ one step
    def forward(
        self, container: Any, rng: SampleRNG | None = None, phase: str | None = None, **batch: Any
    ) -> PipelineOutput:
        """The DiffusionNFT loss of one micro-batch of prompts, in the phase ``nft`` (module docstring)."""
        check_call("DiffusionNFT", self.phase, phase, self.scorer)
        assert self.scorer is not None
        conditions = self.base.prepare_conditions(container, batch)
        clean = clean_flow(self.base, conditions, "DiffusionNFT")
        first = next(iter(clean.values()))
        size, groups, device = first.shape[0], self.group_size, first.device
        rng = self.base.require_rng(rng, size)
        clip_conditions = repeat_conditions(conditions, size, groups, skip=tuple(self.base.state_streams))
        shapes = {name: tuple(x.shape[1:]) for name, x in clean.items()}
        steps = self.train_steps(rng)
        decay = self.old_policy.advance(container, rng.step)
        with self.old_policy.swapped_in(container):  # 1.-2. and v_old at the trained sigmas
            x0 = self.rollout(container, clip_conditions, rng, shapes)
            noised = [self.noised(x0, rng, k) for k in steps]
            old = [self._velocity(container, x_t, t, clip_conditions) for x_t, t in noised]
        rewards, logged = score_clips(
            self.scorer, self.base, x0, clip_conditions, clip_prompts(batch, rng, groups),
            groups=clip_groups(size, groups), names=clip_names(rng, groups),
        )  # fmt: skip
        advantages = group_advantages(rewards.reshape(size, groups), self.advantage_clip).reshape(-1)
        r = optimality_probability(advantages, self.advantage_clip).to(device)
        kept = rewards.isfinite().to(device)
        loss, kl, deviation = self._loss(container, clip_conditions, x0, noised, old, r, kept)
        logged = {**logged, "nft_kl": kl, "nft_old_deviation": deviation, "nft_old_decay": decay}
        return PipelineOutput(loss=loss, metrics={"num_samples": float(size * groups)}, logged=logged)

    def __call__(self, container: Any, rng: SampleRNG | None = None, **batch: Any) -> PipelineOutput:
        return self.forward(container, rng, **batch)

    # ------------------------------------------------------------------ checkpoints (per data-parallel rank)
    optional_rank_state = True
    """A checkpoint without the old policy (saved by another mode, read by ``training.load``) loads: the old
    policy then starts as the first step's weights, with a warning (:class:`OldPolicyEMA`)."""

    def state_dict(self) -> dict[str, Any]:
        """The old policy (:meth:`OldPolicyEMA.state_dict`): the trainer's per-rank checkpoint entry."""
        return self.old_policy.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.old_policy.load_state_dict(state)

    def load_rank_states(self, states: Sequence[Mapping[str, Any]], *, dp_rank: int, dp_size: int) -> None:
        """At another data-parallel size: :meth:`OldPolicyEMA.load_rank_states`."""
        self.old_policy.load_rank_states(states, dp_rank=dp_rank, dp_size=dp_size)

    # ------------------------------------------------------------------ pieces
    def rollout(
        self, container: Any, conditions: Mapping[str, Any], rng: SampleRNG,
        shape: tuple[int, ...] | Mapping[str, tuple[int, ...]],
    ) -> Any:  # fmt: skip
        """The clean clips ``[B * G, *shape]`` (clip ``b * G + g``: prompt ``b``, group index ``g``) of the
        predictor as it is now (the caller swaps the old policy in) by the ODE sampler, from keyed noise; for
        ``shape`` a mapping ``{stream: shape}``, one tensor per stream of the flow state."""
        first = self.base.state_streams[0]
        shapes = dict(shape) if isinstance(shape, Mapping) else {first: tuple(shape)}
        start = stream_noise(rng, "nft_start", self.group_size, shapes, state_device(conditions))

        def velocity(x: dict[str, torch.Tensor], sigma: torch.Tensor, k: int) -> dict[str, torch.Tensor]:
            return self._velocity(container, x, sigma, conditions)

        clips = ode_rollout(velocity, start, self.sigmas)
        return clips if isinstance(shape, Mapping) else clips[first]

    def noised(self, x0: Flow, rng: SampleRNG, k: int) -> tuple[Flow, torch.Tensor]:
        """``x_t = (1 - t) x0 + t eps`` at the sigma ``t = s_k`` of sampler step ``k`` (``eps`` keyed by
        (sample, group index, ``k``, stream)), in ``x0``'s form (a tensor, or one per stream), and ``t`` per
        clip ``[N]``."""
        state = x0 if isinstance(x0, Mapping) else {self.base.state_streams[0]: x0}
        some = next(iter(state.values()))
        shapes = {n: tuple(x.shape[1:]) for n, x in state.items()}
        eps = stream_noise(rng, f"nft_noise_{k}", self.group_size, shapes, some.device)
        t = float(self.sigmas[k])
        mixed = {n: (1 - t) * x + t * eps[n] for n, x in state.items()}
        clips = mixed if isinstance(x0, Mapping) else next(iter(mixed.values()))
        return clips, torch.full((some.shape[0],), t, dtype=torch.float32)

    def _loss(
        self, container: Any, conditions: Mapping[str, Any], x0: dict[str, torch.Tensor],
        noised: list[tuple[dict[str, torch.Tensor], torch.Tensor]], old: list[dict[str, torch.Tensor]],
        r: torch.Tensor, kept: torch.Tensor,
    ) -> tuple[torch.Tensor, float, float]:  # fmt: skip
        """The mean over the trained sigmas of the policy loss plus ``kl_weight`` times the KL; the mean KL and
        the mean squared deviation from the old policy."""
        total, kls, deviations = 0.0, [], []
        for (x_t, t), v_old in zip(noised, old, strict=True):
            velocity = self._velocity(container, x_t, t, conditions)
            per_stream = {
                n: nft_policy_loss(velocity[n], v_old[n], x_t[n], x0[n], t, r, self.beta) for n in x0
            }
            per_clip = weighted_streams(self.base, per_stream) * kept
            step_loss = self.advantage_clip * per_clip.mean()
            deviations.append(_deviation(velocity, v_old))
            if self.kl_weight > 0:
                with torch.no_grad(), as_reference(self.base, container, "DiffusionNFT"):
                    reference = self._velocity(container, x_t, t, conditions)
                squares = {n: (velocity[n].float() - reference[n].float()) ** 2 for n in velocity}
                kl = element_mean(squares).mean()
                step_loss = step_loss + self.kl_weight * kl
                kls.append(float(kl.detach()))
            total = total + step_loss
        loss = total / len(noised)
        return loss, (sum(kls) / len(kls) if kls else 0.0), sum(deviations) / len(deviations)

    def _velocity(
        self,
        container: Any,
        x: Mapping[str, torch.Tensor],
        sigma: torch.Tensor,
        conditions: Mapping[str, Any],
    ) -> dict[str, torch.Tensor]:
        """The predictor's velocity of each stream at ``x`` and per-clip ``sigma`` (the base's code path:
        expert routing)."""
        return dict(self.base.state_velocity(container, "predictor", x, sigma, conditions))


def _deviation(velocity: Mapping[str, torch.Tensor], old: Mapping[str, torch.Tensor]) -> float:
    """``mean (v - v_old)^2`` over every element of every stream (no gradient)."""
    if len(velocity) == 1:
        ((name, v),) = velocity.items()
        return float(((v.detach().float() - old[name].float()) ** 2).mean())
    squares = {n: (v.detach().float() - old[n].float()) ** 2 for n, v in velocity.items()}
    return float(element_mean(squares).mean())


def _check(
    group_size: int, beta: float, advantage_clip: float, kl_weight: float, timestep_fraction: float,
    sampling_steps: int,
) -> None:  # fmt: skip
    problems = []
    if group_size < 2:
        problems.append(
            f"group_size must be >= 2 (advantages compare the clips of a prompt), got {group_size}"
        )
    if not beta > 0:
        problems.append(f"beta must be > 0 (the implicit policies' step from the old policy), got {beta}")
    if not advantage_clip > 0:
        problems.append(f"advantage_clip must be > 0, got {advantage_clip}")
    if not kl_weight >= 0:
        problems.append(f"kl_weight must be >= 0, got {kl_weight}")
    if not 0 < timestep_fraction <= 1:
        problems.append(f"timestep_fraction must lie in (0, 1], got {timestep_fraction}")
    if sampling_steps < 1:
        problems.append(f"sampling_steps must be >= 1, got {sampling_steps}")
    if problems:
        raise ValueError("nft: " + "; ".join(problems))


__all__ = ["WEIGHT_FLOOR", "DiffusionNFT", "nft_policy_loss", "optimality_probability"]
