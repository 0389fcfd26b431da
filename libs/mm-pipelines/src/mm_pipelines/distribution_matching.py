"""Few-step distillation by distribution matching with a learned fake score (DMD2) around a flow-match
pipeline: a frozen ``teacher``, a trainable few-step ``predictor`` (the student generator) and a
trainable ``critic`` (the fake score), trained in two phases (``training.phases``).

The maths, on the flow-match convention ``x_t = (1 - s) x0 + s eps``, velocity ``v = eps - x0``, so a
velocity predictor gives the clean estimate ``x0(x_t) = x_t - s v``:

- **Student schedule.** ``K`` sigmas ``s_0 > s_1 > ... > s_{K-1}`` and a final 0, the scheduler's
  inference grid at the student's shift (:meth:`FlowMatchScheduler.set_inference_timesteps`) with its
  top at ``s_0 = student_sigma_max`` (default 1). The student starts from ``x_0 = s_0 * eps`` (pure noise
  at ``s_0 = 1``; below 1, the noisy state of a zero clean part: the one-step generator's input of Score
  identity Distillation, whose ``sigma_init`` starts it where the teacher's denoiser already separates
  the modes) and takes plain Euler steps, ``x_{k+1} = x_k + (s_{k+1} - s_k) v``, so a sampler on the
  same sigmas (:meth:`student_sigmas`) draws exactly what the student was trained to draw; the first
  step lands on ``x0(x_0)``: the 1-step sample.
- **Backward simulation.** Each step draws one ``k`` in ``[0, K)`` (keyed by the step); the student runs
  its first ``k`` Euler steps from keyed noise without gradients, and its ``k``-th clean estimate
  ``x0_hat = x0(x_k)`` is the sample trained on: the student trains on its own intermediate states.
- **Generator phase** (``distribution_matching``). Re-noise ``x0_hat`` at a keyed timestep ``t``
  (uniform over ``dm_range`` of the grid) with keyed noise, and take both clean estimates without
  gradients: ``x0_real`` from the teacher with classifier-free guidance (``v_u + g (v_c - v_u)``) and
  ``x0_fake`` from the critic. The KL between the student's and the data's noised distributions has the
  gradient ``(x0_fake - x0_real)`` in ``x0_hat`` (up to a positive per-timestep factor); DMD normalizes
  it per sample by ``mean |x0_hat - x0_real|`` and turns it into a loss whose gradient it is:
  ``0.5 * || x0_hat - stopgrad(x0_hat - grad) ||^2``. Only the student receives gradients.
  ``generator_loss: flow_matching`` replaces the term by the ordinary flow-matching loss on the data
  at the student's timesteps (the ablation: the same schedule and budget without distribution matching).
- **Critic phase.** The ordinary flow-matching loss of the critic on the student's samples:
  ``x0_hat`` (no gradients) re-noised at a keyed timestep, regressing ``eps - x0_hat``.

Every draw goes through ``rng`` (``SampleRNG``) under a purpose named for its phase: the same at any
layout, and on resume. DMD2's optional GAN head on the critic is not part of this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch

from .flow_match_scheduler import FlowMatchScheduler
from .keyed_random import SampleRNG
from .pipeline_base import PipelineOutput

GeneratorLoss = Literal["distribution_matching", "flow_matching"]


class DistributionMatchingDistillation:
    """DMD2 phases (``critic``, ``generator``) on a flow-match pipeline ``base`` (a
    :class:`~mm_pipelines.FlowMatchT2VPipeline` or subclass): ``base`` encodes the conditions and runs a
    predictor by role; this object owns the schedule, the draws and the two losses.

    Roles (sub-model names): ``predictor`` (the student), ``teacher`` (frozen), ``critic``.
    """

    def __init__(
        self,
        base: Any,
        *,
        student_steps: int = 4,
        student_shift: float | None = None,
        student_sigma_max: float = 1.0,
        guidance_scale: float = 1.0,
        dm_range: tuple[float, float] = (0.02, 0.98),
        generator_loss: GeneratorLoss = "distribution_matching",
        negative_prompt: str = "",
        teacher_steps: int = 50,
        critic_phase: str = "critic",
        generator_phase: str = "generator",
    ) -> None:
        if student_steps < 1:
            raise ValueError(f"distill.student_steps must be >= 1, got {student_steps}")
        if not 0 < student_sigma_max <= 1:
            raise ValueError(f"distill.student_sigma_max must lie in (0, 1], got {student_sigma_max}")
        low, high = dm_range
        if not 0 <= low < high <= 1:
            raise ValueError(f"distill.dm_range must satisfy 0 <= low < high <= 1, got {list(dm_range)}")
        if generator_loss not in ("distribution_matching", "flow_matching"):
            raise ValueError(
                f"distill.generator_loss must be distribution_matching or flow_matching, got {generator_loss!r}"
            )
        self.base, self.student_steps, self.guidance_scale = base, student_steps, guidance_scale
        self.generator_loss, self.phases = generator_loss, (critic_phase, generator_phase)
        self.negative_prompt, self.teacher_steps = negative_prompt, teacher_steps
        scheduler: FlowMatchScheduler = base.scheduler
        self.student_shift = scheduler.shift if student_shift is None else float(student_shift)
        self.student_sigma_max = float(student_sigma_max)
        if _unshift(self.student_sigma_max, self.student_shift) <= scheduler.sigma_min:
            raise ValueError(
                f"distill.student_sigma_max {student_sigma_max} is at or below the grid's sigma_min "
                f"({scheduler.sigma_min}) at the student's shift {self.student_shift}"
            )
        n = scheduler.num_train_timesteps
        self.dm_indices = (int(low * (n - 1)), max(int(high * (n - 1)), int(low * (n - 1)) + 1))

    # ------------------------------------------------------------------ schedule
    def student_sigmas(self, num_steps: int | None = None) -> torch.Tensor:
        """``K + 1`` sigmas of the student's Euler steps from ``student_sigma_max``, ending in 0 (the
        sampler's grid at its shift); ``num_steps`` instead of ``K`` for another count on the same
        convention."""
        scheduler = _copy_grid(self.base.scheduler, _unshift(self.student_sigma_max, self.student_shift))
        scheduler.set_inference_timesteps(num_steps or self.student_steps, shift=self.student_shift)
        assert scheduler.inference_sigmas is not None
        return scheduler.inference_sigmas

    @torch.no_grad()
    def sample(
        self,
        container: Any,
        noise: torch.Tensor,
        conditions: Mapping[str, Any],
        *,
        role: str = "predictor",
        num_steps: int | None = None,
        stop_after: int | None = None,
        sigmas: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Euler sampling from ``noise`` with sub-model ``role`` (the teacher with its guidance) on a
        ``num_steps`` schedule (default: the student's ``K``) or on explicit ``sigmas`` (decreasing, ending
        in 0), stopping after ``stop_after`` steps (default: all, the clean sample). The start is
        ``sigmas[0] * noise``."""
        sigmas = self.student_sigmas(num_steps) if sigmas is None else sigmas
        x = noise.float() * sigmas[0]
        for k in range(len(sigmas) - 1 if stop_after is None else stop_after):
            if role == "teacher":
                v = self._guided_teacher(container, x, sigmas[k], conditions)
            else:
                v = self.velocity(container, role, x, sigmas[k], conditions)
            x = x + (sigmas[k + 1] - sigmas[k]) * v.float()
        return x

    # ------------------------------------------------------------------ phases
    def forward(
        self, container: Any, rng: SampleRNG | None = None, phase: str | None = None, **batch: Any
    ) -> PipelineOutput:
        """The loss of ``phase`` (``critic`` or ``generator``) on one micro-batch."""
        if phase not in self.phases:
            raise ValueError(
                f"distillation: model(**batch, phase=...) needs a phase in {list(self.phases)} (training.phases), "
                f"got {phase!r}"
            )
        conditions = self.base.prepare_conditions(container, batch)
        x0 = conditions["latents"]
        if self.guidance_scale != 1.0 and phase == self.phases[1]:
            conditions["negative_prompt_embeds"] = self._negative_embeds(container, batch, x0.shape[0])
        rng = self.base.require_rng(rng, x0.shape[0])
        if phase == self.phases[0]:
            loss = self._critic_loss(container, conditions, rng, phase)
        elif self.generator_loss == "flow_matching":
            loss = self._student_flow_matching_loss(container, conditions, rng, phase)
        else:
            loss = self._distribution_matching_loss(container, conditions, rng, phase)
        return PipelineOutput(loss=loss, metrics={"num_samples": float(x0.shape[0])})

    def __call__(self, container: Any, rng: SampleRNG | None = None, **batch: Any) -> PipelineOutput:
        return self.forward(container, rng, **batch)

    def _critic_loss(self, container: Any, conditions: dict, rng: SampleRNG, phase: str) -> torch.Tensor:
        with torch.no_grad():
            x0_hat = self._student_estimate(container, conditions, rng, phase)
        x_t, sigma, noise = self._renoise(x0_hat, rng, phase)
        v = self.velocity(container, "critic", x_t, sigma, conditions)
        return (v.float() - (noise - x0_hat)).pow(2).flatten(1).mean(1).mean()

    def _distribution_matching_loss(
        self, container: Any, conditions: dict, rng: SampleRNG, phase: str
    ) -> torch.Tensor:
        x0_hat = self._student_estimate(container, conditions, rng, phase)
        with torch.no_grad():
            x_t, sigma, _ = self._renoise(x0_hat.detach(), rng, phase)
            real = self._clean(x_t, sigma, self._guided_teacher(container, x_t, sigma, conditions))
            fake = self._clean(x_t, sigma, self.velocity(container, "critic", x_t, sigma, conditions))
            scale = (x0_hat.detach() - real).abs().flatten(1).mean(1).clamp_min(1e-6)
            grad = (fake - real) / scale.reshape(-1, *([1] * (x0_hat.ndim - 1)))
            target = x0_hat.detach() - grad
        return 0.5 * (x0_hat.float() - target).pow(2).flatten(1).mean(1).mean()

    def _student_flow_matching_loss(
        self, container: Any, conditions: dict, rng: SampleRNG, phase: str
    ) -> torch.Tensor:
        x0 = conditions["latents"]
        sigmas = self.student_sigmas()
        k = rng.step_randint(f"{phase}_student_step", 0, self.student_steps)
        noise = rng.randn(f"{phase}_noise", x0.shape[1:], device=x0.device)
        x_k = FlowMatchScheduler.add_noise(x0, noise, float(sigmas[k]))
        v = self.velocity(container, "predictor", x_k, sigmas[k], conditions)
        return (v.float() - (noise - x0)).pow(2).flatten(1).mean(1).mean()

    # ------------------------------------------------------------------ pieces
    def _student_estimate(self, container: Any, conditions: dict, rng: SampleRNG, phase: str) -> torch.Tensor:
        """Backward simulation: ``x0(x_k)`` at a keyed student step ``k``, after ``k`` Euler steps
        without gradients; the last call runs with gradients when the student trains here."""
        x0 = conditions["latents"]
        k = rng.step_randint(f"{phase}_student_step", 0, self.student_steps)
        noise = rng.randn(f"{phase}_start", x0.shape[1:], device=x0.device)
        sigmas = self.student_sigmas()
        x_k = self.sample(container, noise, conditions, stop_after=k) if k else noise * sigmas[0]
        sigma = sigmas[k]
        return self._clean(x_k, sigma, self.velocity(container, "predictor", x_k, sigma, conditions))

    def _renoise(
        self, x0: torch.Tensor, rng: SampleRNG, phase: str
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        scheduler: FlowMatchScheduler = self.base.scheduler
        low, high = self.dm_indices
        index = rng.per_sample(
            f"{phase}_timestep", lambda g: torch.randint(low, high, (), generator=g), "cpu"
        )
        sigma = scheduler.sigmas_for(index).to(x0.device)
        noise = rng.randn(f"{phase}_noise", x0.shape[1:], device=x0.device)
        return FlowMatchScheduler.add_noise(x0, noise, sigma), sigma, noise

    def _guided_teacher(
        self, container: Any, x_t: torch.Tensor, sigma: torch.Tensor, conditions: dict
    ) -> torch.Tensor:
        v = self.velocity(container, "teacher", x_t, sigma, conditions)
        if self.guidance_scale == 1.0:
            return v
        v_u = self.velocity(
            container,
            "teacher",
            x_t,
            sigma,
            {**conditions, "prompt_embeds": conditions["negative_prompt_embeds"]},
        )
        return v_u + self.guidance_scale * (v - v_u)

    def _negative_embeds(self, container: Any, batch: Mapping[str, Any], size: int) -> torch.Tensor:
        """The teacher's unconditional text: the batch's ``negative_prompt_embeds``, else ``negative_prompt``
        through the base pipeline's text encoding."""
        if "negative_prompt_embeds" in batch:
            return batch["negative_prompt_embeds"]
        if "prompt_embeds" in batch:
            raise KeyError(
                "distill.guidance_scale != 1 with pre-encoded prompts (prompt_embeds) needs the batch's "
                "negative_prompt_embeds too: the unconditional text of the teacher's guidance"
            )
        return self.base.encode_prompt(container, {"prompt": [self.negative_prompt] * size})

    @staticmethod
    def _clean(x_t: torch.Tensor, sigma: torch.Tensor | float, v: torch.Tensor) -> torch.Tensor:
        s = torch.as_tensor(sigma, dtype=torch.float32, device=x_t.device)
        s = s.reshape(-1, *([1] * (x_t.ndim - 1))) if s.ndim else s
        return x_t.float() - s * v.float()

    def velocity(
        self,
        container: Any,
        role: str,
        x_t: torch.Tensor,
        sigma: torch.Tensor | float,
        conditions: Mapping[str, Any],
    ) -> torch.Tensor:
        """The velocity of sub-model ``role`` at ``x_t`` and ``sigma`` (scalar or ``[B]``), through the
        base pipeline's ``predict`` (its conditioning: i2v channels, ti2v first frame)."""
        b = x_t.shape[0]
        s = torch.as_tensor(sigma, dtype=torch.float32).reshape(-1).expand(b).cpu()
        hidden = x_t
        if "image_condition" in conditions:
            hidden = torch.cat([x_t, conditions["image_condition"].to(x_t.dtype)], dim=1)
        grid = self.base.scheduler.sigmas64
        noised = {
            "indices": (s.double()[:, None] - grid[None])
            .abs()
            .argmin(dim=1),  # nearest grid point: expert routing
            "hidden_states": hidden,
            "timestep": (s * self.base.scheduler.num_train_timesteps).to(x_t.device),
            "encoder_hidden_states": conditions["prompt_embeds"],
            "latent_shape": tuple(x_t.shape),
        }
        roles = self.base.roles
        self.base.roles = {**roles, "predictor": roles.get(role, role)}
        try:
            return self.base.predict(container, noised)
        finally:
            self.base.roles = roles


def _copy_grid(scheduler: FlowMatchScheduler, sigma_max: float) -> FlowMatchScheduler:
    """``scheduler``'s grid convention with its top at the unshifted ``sigma_max``."""
    return FlowMatchScheduler(
        num_train_timesteps=scheduler.num_train_timesteps,
        shift=scheduler.shift,
        sigma_min=scheduler.sigma_min,
        sigma_max=min(sigma_max, scheduler.sigma_max),
        extra_one_step=scheduler.extra_one_step,
    )


def _unshift(sigma: float, shift: float) -> float:
    """The unshifted sigma that the time shift ``shift`` maps to ``sigma`` (inverse of
    :func:`~mm_pipelines.flow_match_scheduler.shift_sigmas`)."""
    return sigma / (shift - (shift - 1.0) * sigma)


__all__ = ["DistributionMatchingDistillation", "GeneratorLoss"]
