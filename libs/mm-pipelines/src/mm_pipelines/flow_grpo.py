"""Flow-GRPO (Liu et al. 2025, "Flow-GRPO: Training Flow Matching Models via Online RL") around a flow-match
pipeline: the trainable policy (``predictor``) samples ``G`` clips per prompt as an SDE (:mod:`.rollout`),
a reward scores them, and the policy learns from the group-normalised rewards in the training phase ``grpo``.

One optimizer step of the phase, per micro-batch of ``B`` prompts (each rank its own prompts: the data
loader spreads a step's prompts over the data-parallel ranks):

1. **Rollout** (no gradients): ``G`` clips per prompt, ``N = B * G``, with the SDE sampler on
   ``sampling_steps`` sigmas at the time ``shift`` and noise level ``a``, each clip under its prompt's
   conditions as the pipeline trains on them (the text; i2v: the mask and first-frame latents on the
   predictor's channels; ti2v: the clean first latent frame, fixed at every state, only the later frames
   sampled and scored by the log-probabilities), and with ``guidance_scale`` ``g != 1`` the classifier-free
   guided velocity ``v_u + g (v_c - v_u)`` (``v_u`` at the negative prompt's embeddings: the batch's
   ``negative_prompt_embeds``, else ``negative_prompt`` through the text encoder), as the Wan sampler takes
   it. Each clip's start noise and each
   step's noise are keyed by (seed, optimizer step, the prompt's global sample index, group index ``g``,
   sampler step ``k``) through ``SampleRNG`` (purposes ``grpo_start_<g>``, ``grpo_step_<k>_<g>``): the
   same clips at any data-parallel / context-parallel / accumulation layout. The clip's shape is that of
   the prompt's training sample (its clean latents: a clip of the dataset, or its cache); their content is
   not used. On a flow state of several streams (LTX-2's ``video`` and ``audio``) every stream is rolled
   out together, each with noise of its own (``grpo_start_<stream>_<g>``, ``grpo_step_<k>_<stream>_<g>``
   for the streams after the first: :mod:`.group_rollouts`), and a transition's log-probability and KL are
   the means over every element of every stream (:mod:`.rollout`: the joint transition's log-density,
   rescaled).
2. **Rewards**: the scorer the trainer attaches (:attr:`FlowGRPO.scorer`: ``training.rewards``, decoding
   with the VAE only when a reward needs frames) gives each clip's reward ``r`` (NaN for a clip dropped by
   ``reward_failure: skip``) and the statistics to log.
3. **Advantages**, per group (the ``G`` clips of one prompt): ``A = (r - mean_g r) / (std_g r + 1e-4)``
   (population std over the group's scored clips; a dropped clip gets ``A = 0``), clipped to
   ``[-advantage_clip, advantage_clip]``; with ``advantage_scale: none`` not divided, ``A = r - mean_g r``
   (Dr. GRPO's advantage: a group whose rewards differ only by noise moves the policy little).
4. **Loss**, on a fraction of the sampler's steps: ``max(1, floor(timestep_fraction * K))`` step indices,
   one subset per optimizer step (keyed by the step: every clip, micro-batch and rank of the step trains
   the same steps; with both A14B experts each step runs the expert of its sigma). At each chosen step
   ``k`` the policy's velocity at the rollout's ``x_k`` (the rollout's: same conditions, same guidance) gives its transition mean and the log-probability
   ``log p`` of the rollout's ``x_{k+1}``; with ``ratio = exp(log p - log p_old)`` (``log p_old``: the
   rollout's),

       policy loss = mean_clips max(-A * ratio, -A * clip(ratio, 1 - clip_range, 1 + clip_range))
       KL          = mean_clips mean_elements (mean_policy - mean_reference)^2 / (2 std^2)

   (the KL of the two Gaussian transitions of the step, per element), and the loss is the mean over the
   chosen steps of ``policy loss + kl_weight * KL``. The reference is the frozen sub-model ``reference``
   when the container has one, else the policy with its LoRA adapters off (no copy of the weights).

5. **Updates per rollout** (``updates_per_rollout = U``, default 1). Optimizer step ``t`` rolls out when
   ``t % U == 0`` (a *rollout step*) and keeps, per micro-batch (its position among the step's calls of the
   phase, on each rank), the rollout, its conditions and its advantages; the next ``U - 1`` optimizer steps
   train on the kept rollouts again, micro-batch ``m`` on the ``m``-th kept one, each on its own keyed
   subset of the sampler's steps. So every optimizer step has the micro-steps of the data's
   ``gradient_accumulation_steps``; the data loader advances every optimizer step as usual, but only the
   rollout steps' prompts are rolled out (a run of ``T`` steps rolls out the prompts of ``T / U`` of them,
   the others' batches are read and not used). Layout: each rank keeps its own micro-batches' rollouts, the
   same prompts' at any layout, so the losses stay layout-free. Resume: the kept rollouts live in memory
   only; a run resumes exactly from a checkpoint at a rollout step (``mm_config`` refuses ``save_interval``
   and ``train_iters`` that are not multiples of ``U``), and a resume anywhere else (a stop request's save
   between rollout steps) is refused at its first step with a message naming the step.

With ``U = 1`` the rollout's policy is the policy updated, so ``ratio`` is 1 in value up to the numerics of
the two forwards, and the clip bounds the update only where they differ; the gradient is the
advantage-weighted score ``-A * grad log p``. From the second update of a rollout on, the policy has moved
and the ratio departs from 1: the clip binds. Logged per step: the scorer's reward statistics (``reward``,
``reward_std``, ``reward_<id>`` ...: at rollout steps only), ``grpo_kl``, ``grpo_clip_fraction`` (the share
of clips and steps whose ratio left the clip range) and ``grpo_ratio_deviation`` (the mean ``|ratio - 1|``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

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
from .pipeline_base import PipelineOutput
from .preference import as_reference
from .rollout import Flow, Rollout, element_mean, sde_rollout, state_transition, transition_log_prob

ADVANTAGE_EPS = 1e-4
"""Added to a group's reward std before dividing by it (a group of equal rewards: advantages 0)."""


ADVANTAGE_SCALES = ("group_std", "none")
"""What a reward less its group's mean is divided by (``model.pipeline.grpo.advantage_scale``)."""


def group_advantages(rewards: torch.Tensor, clip: float, scale: str = "group_std") -> torch.Tensor:
    """``[B, G]`` advantages of the rewards ``[B, G]`` of ``B`` groups of ``G`` clips (module docstring, 3.):
    less the group's mean over its finite rewards and, with ``scale="group_std"``, divided by their std;
    0 where the reward is NaN, clipped to ``+-clip``."""
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"advantage scale must be one of {ADVANTAGE_SCALES}, got {scale!r}")
    rewards = rewards.double()
    kept = rewards.isfinite()
    count = kept.sum(dim=1, keepdim=True).clamp(min=1)
    filled = torch.where(kept, rewards, torch.zeros_like(rewards))
    mean = filled.sum(dim=1, keepdim=True) / count
    spread = torch.where(kept, (rewards - mean) ** 2, torch.zeros_like(rewards))
    std = (spread.sum(dim=1, keepdim=True) / count).sqrt()
    scaled = (rewards - mean) / (std + ADVANTAGE_EPS) if scale == "group_std" else rewards - mean
    advantages = torch.where(kept, scaled, torch.zeros_like(rewards))
    return advantages.clamp(-clip, clip)


def clipped_policy_loss(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor, clip_range: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The clipped surrogate (module docstring, 4.): its mean over the clips (a scalar) and, per clip
    ``[N]``, whether its ratio lies outside ``[1 - clip_range, 1 + clip_range]``."""
    ratio = torch.exp(log_prob - old_log_prob.detach())
    advantages = advantages.to(ratio.dtype)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_range, 1 + clip_range)
    outside = (ratio.detach() - 1).abs() > clip_range
    return torch.maximum(unclipped, clipped).mean(), outside


@dataclass
class KeptRollout:
    """A micro-batch's rollout kept for the updates after its rollout step (module docstring, 5.)."""

    step: int
    conditions: Mapping[str, Any]
    rollout: Rollout
    advantages: torch.Tensor


def transition_kl(mean: Flow, reference_mean: Flow, std: float) -> torch.Tensor:
    """``[N]``: the KL of ``N(mean, std^2)`` from ``N(reference_mean, std^2)``, per element, averaged (over
    every element of every stream for a state of several: :mod:`.rollout`)."""
    if isinstance(mean, Mapping):
        squares = {n: (m - reference_mean[n].detach()) ** 2 for n, m in mean.items()}
    else:
        squares = (mean - reference_mean.detach()) ** 2
    return element_mean(squares) / (2 * std * std)


class FlowGRPO:
    """Flow-GRPO in the phase ``grpo`` on a flow-match pipeline ``base`` with ``prepare_conditions`` and
    ``state_velocity`` (:class:`~mm_pipelines.FlowMatchT2VPipeline`: t2v, i2v, ti2v); guidance needs its
    ``unconditional``."""

    def __init__(
        self,
        base: Any,
        *,
        group_size: int = 8,
        noise_level: float = 0.7,
        clip_range: float = 1e-4,
        advantage_clip: float = 5.0,
        advantage_scale: str = "group_std",
        kl_weight: float = 0.04,
        timestep_fraction: float = 0.5,
        sampling_steps: int = 10,
        shift: float | None = None,
        guidance_scale: float = 1.0,
        negative_prompt: str = "",
        updates_per_rollout: int = 1,
        phase: str = "grpo",
    ) -> None:
        _check(
            group_size, noise_level, clip_range, advantage_clip, kl_weight, timestep_fraction, sampling_steps,
            updates_per_rollout, advantage_scale,
        )  # fmt: skip
        if guidance_scale != 1.0 and not callable(getattr(base, "unconditional", None)):
            raise ValueError(
                f"grpo.guidance_scale={guidance_scale}: {type(base).__name__} has no unconditional conditions "
                "for classifier-free guidance; set guidance_scale: 1"
            )
        self.guidance_scale, self.negative_prompt = float(guidance_scale), negative_prompt
        self.base, self.phase, self.group_size = base, phase, int(group_size)
        self.noise_level, self.clip_range, self.advantage_clip = (
            float(noise_level),
            float(clip_range),
            float(advantage_clip),
        )
        self.kl_weight, self.timestep_fraction = float(kl_weight), float(timestep_fraction)
        self.advantage_scale = advantage_scale
        self.sampling_steps, self.updates_per_rollout = int(sampling_steps), int(updates_per_rollout)
        self.kept: list[KeptRollout] = []  # the last rollout step's micro-batches, in call order
        self._calls = (-1, 0)  # (optimizer step, calls of the phase at that step so far)
        self.sigmas = rollout_sigmas(base.scheduler, self.sampling_steps, shift)
        self.scorer: SampleScorer | None = None

    @classmethod
    def from_options(cls, base: Any, options: Mapping[str, Any]) -> FlowGRPO:
        """From the keys of ``model.pipeline.grpo`` (``mm_config.GRPOOptions``) around ``base``."""
        return cls(base, **dict(options))

    @property
    def scheduler(self) -> FlowMatchScheduler:
        return self.base.scheduler

    @property
    def trained_steps(self) -> int:
        """How many of the sampler's steps each optimizer step trains on."""
        return max(1, int(self.timestep_fraction * self.sampling_steps))

    # ------------------------------------------------------------------ one step
    def forward(
        self, container: Any, rng: SampleRNG | None = None, phase: str | None = None, **batch: Any
    ) -> PipelineOutput:
        """The Flow-GRPO loss of one micro-batch of prompts, in the phase ``grpo`` (module docstring)."""
        check_call("Flow-GRPO", self.phase, phase, self.scorer)
        rng = self.base.require_rng(rng, len(rng) if rng is not None else 0)
        position, update = self._position(rng.step), rng.step % self.updates_per_rollout
        logged: dict[str, float] = {}
        if update == 0:
            kept, logged = self._roll_out(container, rng, batch)
            self.kept = [*self.kept[:position], kept] if position else [kept]
        else:
            kept = self._kept_at(position, rng.step, rng.step - update)
        loss, stats = self._loss(
            container, kept.conditions, kept.rollout, kept.advantages, self.train_steps(rng)
        )
        clips = float(kept.advantages.numel())
        return PipelineOutput(loss=loss, metrics={"num_samples": clips}, logged={**logged, **stats})

    def _roll_out(
        self, container: Any, rng: SampleRNG, batch: Mapping[str, Any]
    ) -> tuple[KeptRollout, dict[str, float]]:
        """Steps 1-3 of the module docstring for one micro-batch: its rollout, rewards and advantages, and the
        scorer's statistics."""
        assert self.scorer is not None
        conditions = self.base.prepare_conditions(container, batch)
        clean = clean_flow(self.base, conditions, "Flow-GRPO")
        size, groups = next(iter(clean.values())).shape[0], self.group_size
        rng = self.base.require_rng(rng, size)
        clip_conditions = self.clip_conditions(container, batch, conditions)
        shapes = {name: tuple(x.shape[1:]) for name, x in clean.items()}
        rollout = self.rollout(container, clip_conditions, rng, shapes)
        prompts, names = clip_prompts(batch, rng, groups), clip_names(rng, groups)
        whole = self._whole(rollout.samples, clip_conditions)
        rewards, logged = score_clips(
            self.scorer,
            self.base,
            whole,
            clip_conditions,
            prompts,
            groups=clip_groups(size, groups),
            names=names,
        )
        advantages = group_advantages(
            rewards.reshape(size, groups), self.advantage_clip, self.advantage_scale
        ).reshape(-1)
        return KeptRollout(rng.step, clip_conditions, rollout, advantages), logged

    def _position(self, step: int) -> int:
        """This call's position among the phase's calls (micro-batches) of optimizer step ``step``."""
        last, count = self._calls
        self._calls = (step, count + 1 if step == last else 1)
        return self._calls[1] - 1

    def _kept_at(self, position: int, step: int, rollout_step: int) -> KeptRollout:
        """The rollout kept for micro-batch ``position`` at ``rollout_step``; a clear error when there is none
        (a run resumed between rollout steps, module docstring 5.)."""
        if position < len(self.kept) and self.kept[position].step == rollout_step:
            return self.kept[position]
        raise ValueError(
            f"Flow-GRPO: optimizer step {step + 1} trains on the rollouts of step {rollout_step + 1} (model.pipeline.grpo.updates_per_rollout="
            f"{self.updates_per_rollout}), which this process did not roll out (micro-batch {position}): a run "
            "resumes only from a checkpoint at a rollout step (an iteration that is a multiple of "
            "updates_per_rollout); resume from such a checkpoint"
        )

    def __call__(self, container: Any, rng: SampleRNG | None = None, **batch: Any) -> PipelineOutput:
        return self.forward(container, rng, **batch)

    # ------------------------------------------------------------------ pieces
    def clip_conditions(
        self, container: Any, batch: Mapping[str, Any], conditions: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Each clip's conditions ``[B * G, ...]`` (clip ``b * G + g``: prompt ``b``'s) from the prompts'
        ``conditions`` (``prepare_conditions``): every per-sample tensor of them but the clean flow state
        (:func:`~mm_pipelines.group_rollouts.repeat_conditions`: Wan's ``prompt_embeds`` and i2v
        ``image_condition``; LTX-2's texts and mask); ti2v: ``first_frame`` (the clean first latent frame);
        with guidance: ``negative_prompt_embeds`` (the base's ``unconditional`` text)."""
        groups, streams = self.group_size, tuple(self.base.state_streams)
        size = next(iter(self.base.clean_state(conditions).values())).shape[0]
        out = repeat_conditions(conditions, size, groups, skip=streams)
        if getattr(self.base, "task", None) == "ti2v":
            out["first_frame"] = conditions["latents"][:, :, :1].repeat_interleave(groups, dim=0)
        if self.guidance_scale != 1.0:
            negative = self.base.unconditional(container, batch, conditions, self.negative_prompt)
            out["negative_prompt_embeds"] = negative["prompt_embeds"].repeat_interleave(groups, dim=0)
        return out

    @staticmethod
    def clips(generated: torch.Tensor, conditions: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Whole clips ``[N, c, T, h, w]`` from the sampled latents: ti2v's clean first frame before its
        generated frames; the latents themselves otherwise."""
        first = conditions.get("first_frame")
        return generated if first is None else torch.cat([first.to(generated), generated], dim=2)

    def _whole(
        self, state: Mapping[str, torch.Tensor], conditions: Mapping[str, Any]
    ) -> dict[str, torch.Tensor]:
        """:meth:`clips` of the first stream of ``state`` (ti2v's first frame belongs to Wan's one stream)."""
        first = self.base.state_streams[0]
        return {**state, first: self.clips(state[first], conditions)}

    def rollout(
        self, container: Any, conditions: Mapping[str, Any], rng: SampleRNG,
        shape: tuple[int, ...] | Mapping[str, tuple[int, ...]],
    ) -> Rollout:  # fmt: skip
        """``G`` clips per prompt of ``rng``'s samples (clip ``b * G + g``: prompt ``b``, group index ``g``),
        of latent ``shape`` (one stream's; or ``{stream: shape}``, the flow state's streams), by the policy
        under each clip's ``conditions`` (:meth:`clip_conditions`); the noise keyed by (step, prompt, group
        index, sampler step, stream: :func:`~mm_pipelines.group_rollouts.stream_noise`). With a
        ``first_frame`` (ti2v) the rollout's states are the frames after it (:meth:`clips` puts it back).
        The states are tensors for a ``shape``, one per stream for a mapping."""
        groups, device = self.group_size, state_device(conditions)
        first = self.base.state_streams[0]
        shapes = dict(shape) if isinstance(shape, Mapping) else {first: tuple(shape)}
        skip = 1 if "first_frame" in conditions else 0

        def keyed(purpose: str) -> dict[str, torch.Tensor]:  # clip b * G + g from (sample b, g)'s key
            noise = stream_noise(rng, purpose, groups, shapes, device)
            return {**noise, first: noise[first][:, :, skip:]} if skip else noise

        def velocity(x: dict[str, torch.Tensor], sigma: torch.Tensor, k: int) -> dict[str, torch.Tensor]:
            return self._velocity(container, x, sigma, conditions)

        rollout = sde_rollout(velocity, keyed("grpo_start"), lambda k: keyed(f"grpo_step_{k}"), self.sigmas,
                              self.noise_level)  # fmt: skip
        if isinstance(shape, Mapping):
            return rollout
        return Rollout(rollout.states[first], rollout.log_probs, rollout.sigmas)

    def train_steps(self, rng: SampleRNG) -> list[int]:
        """The sampler steps this optimizer step trains on: :attr:`trained_steps` of them, keyed by the step."""
        return keyed_steps(rng, "grpo_timesteps", self.trained_steps, self.sampling_steps)

    def _loss(
        self, container: Any, conditions: Mapping[str, Any], rollout: Rollout, advantages: torch.Tensor,
        steps: list[int],
    ) -> tuple[torch.Tensor, dict[str, float]]:  # fmt: skip
        """The mean over ``steps`` of the clipped policy loss plus ``kl_weight`` times the KL; the mean KL, the
        share of ratios outside the clip range and the mean ``|ratio - 1|`` (``grpo_*``)."""
        total, kls, outside, deviation = 0.0, [], [], []
        for k in steps:
            x, x_next = rollout.state(k), rollout.state(k + 1)
            some = next(iter(x.values()))
            sigma = torch.full((some.shape[0],), float(self.sigmas[k]), dtype=torch.float32)
            mean, std = state_transition(x, self._velocity(container, x, sigma, conditions), self.sigmas, k,
                                         self.noise_level)  # fmt: skip
            log_prob = transition_log_prob(x_next, mean, std)
            policy, out = clipped_policy_loss(
                log_prob, rollout.log_probs[k], advantages.to(some.device), self.clip_range
            )
            step_loss = policy
            if self.kl_weight > 0:
                with torch.no_grad(), as_reference(self.base, container, "Flow-GRPO"):
                    reference_velocity = self._velocity(container, x, sigma, conditions)
                reference_mean, _ = state_transition(x, reference_velocity, self.sigmas, k, self.noise_level)
                kl = transition_kl(mean, reference_mean, std).mean()
                step_loss = step_loss + self.kl_weight * kl
                kls.append(float(kl.detach()))
            total = total + step_loss
            outside.append(float(out.float().mean()))
            deviation.append(float((log_prob.detach() - rollout.log_probs[k]).exp().sub(1).abs().mean()))
        stats = {
            "grpo_kl": sum(kls) / len(kls) if kls else 0.0,
            "grpo_clip_fraction": sum(outside) / len(outside),
            "grpo_ratio_deviation": sum(deviation) / len(deviation),
        }
        return total / len(steps), stats

    def _velocity(
        self,
        container: Any,
        x: Mapping[str, torch.Tensor],
        sigma: torch.Tensor,
        conditions: Mapping[str, Any],
    ) -> dict[str, torch.Tensor]:
        """The predictor's velocity of each stream at the sampled state ``x`` and per-clip ``sigma`` under the
        clips' ``conditions`` (the base's code path: i2v channels, expert routing), guided when
        ``guidance_scale`` != 1; with a ``first_frame`` (ti2v) ``x``'s first stream and its velocity are the
        frames after it."""
        whole = self._whole(x, conditions)

        def velocity(text: torch.Tensor | None) -> dict[str, torch.Tensor]:
            given = conditions if text is None else {**conditions, "prompt_embeds": text}
            v = self.base.state_velocity(container, "predictor", whole, sigma, given)
            return {n: v[n][:, :, whole[n].shape[2] - x[n].shape[2] :] if v[n].dim() > 2 else v[n] for n in x}

        v = velocity(None)
        if self.guidance_scale == 1.0:
            return v
        v_u = velocity(conditions["negative_prompt_embeds"])
        return {n: v_u[n] + self.guidance_scale * (v[n] - v_u[n]) for n in v}


def _check(
    group_size: int, noise_level: float, clip_range: float, advantage_clip: float, kl_weight: float,
    timestep_fraction: float, sampling_steps: int, updates_per_rollout: int, advantage_scale: str,
) -> None:  # fmt: skip
    problems = []
    if advantage_scale not in ADVANTAGE_SCALES:
        problems.append(f"advantage_scale must be one of {ADVANTAGE_SCALES}, got {advantage_scale!r}")
    if updates_per_rollout < 1:
        problems.append(f"updates_per_rollout must be >= 1, got {updates_per_rollout}")
    if group_size < 2:
        problems.append(
            f"group_size must be >= 2 (advantages compare the clips of a prompt), got {group_size}"
        )
    if not noise_level > 0:
        problems.append(f"noise_level must be > 0 (the SDE's transitions need a density), got {noise_level}")
    if not clip_range > 0:
        problems.append(f"clip_range must be > 0, got {clip_range}")
    if not advantage_clip > 0:
        problems.append(f"advantage_clip must be > 0, got {advantage_clip}")
    if not kl_weight >= 0:
        problems.append(f"kl_weight must be >= 0, got {kl_weight}")
    if not 0 < timestep_fraction <= 1:
        problems.append(f"timestep_fraction must lie in (0, 1], got {timestep_fraction}")
    if sampling_steps < 2:
        problems.append(f"sampling_steps must be >= 2, got {sampling_steps}")
    if problems:
        raise ValueError("grpo: " + "; ".join(problems))


__all__ = [
    "ADVANTAGE_EPS",
    "ADVANTAGE_SCALES",
    "FlowGRPO",
    "SampleScorer",
    "clipped_policy_loss",
    "group_advantages",
    "transition_kl",
]
