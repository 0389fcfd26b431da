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

**The flow state.** The student, teacher and critic act on the base pipeline's *state*: a mapping of
streams (Wan: ``latents``; LTX-2: ``video`` and ``audio``), all noised at one sigma per sample. The base
pipeline provides (:class:`FlowState`) its ``scheduler`` (the grid), ``state_streams``,
``clean_state(conditions)`` and ``state_velocity(container, role, state, sigma, conditions)``, optionally
``state_weights`` (each stream's loss weight, default 1) and, for guidance,
``unconditional(container, batch, conditions, negative_prompt)``. Each stream is re-noised with noise of
its own; the DMD normaliser is the mean over every stream's elements; the losses are the streams' weighted
sum.

Every draw goes through ``rng`` (``SampleRNG``) under a purpose named for its phase (the first stream's
draws under the bare purpose, each further stream's with ``_<stream>`` appended): the same at any
layout, and on resume. DMD2's optional GAN head on the critic is not part of this module.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal, Protocol, TypeVar

import torch

from .flow_match_scheduler import FlowMatchScheduler
from .keyed_random import SampleRNG
from .pipeline_base import PipelineOutput

GeneratorLoss = Literal["distribution_matching", "flow_matching"]
State = dict[str, torch.Tensor]
Noise = TypeVar("Noise", torch.Tensor, Mapping[str, torch.Tensor])


class FlowState(Protocol):
    """What a base pipeline gives the distillation (:class:`~mm_pipelines.FlowMatchT2VPipeline` has it)."""

    scheduler: FlowMatchScheduler
    state_streams: tuple[str, ...]

    def clean_state(self, conditions: Mapping[str, Any]) -> State:
        """The clean sample's streams, each ``[B, ...]``, from the encoded ``conditions``."""
        ...

    def state_velocity(
        self, container: Any, role: str, state: Mapping[str, torch.Tensor], sigma: torch.Tensor,
        conditions: Mapping[str, Any],
    ) -> State:  # fmt: skip
        """Sub-model ``role``'s velocity for each stream of ``state`` at per-sample ``sigma`` ``[B]``."""
        ...


class DistributionMatchingDistillation:
    """DMD2 phases (``critic``, ``generator``) on a flow-match pipeline ``base`` (a :class:`FlowState`:
    :class:`~mm_pipelines.FlowMatchT2VPipeline`, LTX-2's pipeline): ``base`` encodes the conditions and
    runs a predictor by role on its flow state; this object owns the schedule, the draws and the two losses.

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
        if guidance_scale != 1.0 and not callable(getattr(base, "unconditional", None)):
            raise ValueError(
                f"distill.guidance_scale={guidance_scale}: {type(base).__name__} has no unconditional conditions "
                "for the teacher's classifier-free guidance; set guidance_scale: 1"
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

    @classmethod
    def from_options(cls, base: Any, options: Mapping[str, Any]) -> DistributionMatchingDistillation:
        """From the keys of ``model.pipeline.distill`` (``mm_config.DistillOptions``) around ``base``."""
        options = dict(options)
        low, high = options.pop("dm_range", (0.02, 0.98))
        return cls(base, dm_range=(float(low), float(high)), **options)

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
        noise: Noise,
        conditions: Mapping[str, Any],
        *,
        role: str = "predictor",
        num_steps: int | None = None,
        stop_after: int | None = None,
        sigmas: torch.Tensor | None = None,
    ) -> Noise:
        """Euler sampling from ``noise`` (a tensor for a one-stream state, else one tensor per stream) with
        sub-model ``role`` (the teacher with its guidance) on a ``num_steps`` schedule (default: the
        student's ``K``) or on explicit ``sigmas`` (decreasing, ending in 0), stopping after
        ``stop_after`` steps (default: all, the clean sample). The start is ``sigmas[0] * noise``;
        the result has ``noise``'s form."""
        sigmas = self.student_sigmas(num_steps) if sigmas is None else sigmas
        state = self._as_state(noise)
        x = {name: n.float() * sigmas[0] for name, n in state.items()}
        for k in range(len(sigmas) - 1 if stop_after is None else stop_after):
            if role == "teacher":
                v = self._guided_teacher(container, x, sigmas[k], conditions)
            else:
                v = self._velocity(container, role, x, sigmas[k], conditions)
            x = {name: x[name] + (sigmas[k + 1] - sigmas[k]) * v[name].float() for name in x}
        return x if isinstance(noise, Mapping) else next(iter(x.values()))

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
        size = next(iter(self.base.clean_state(conditions).values())).shape[0]
        unconditional = None
        if self.guidance_scale != 1.0 and phase == self.phases[1]:
            unconditional = self.base.unconditional(container, batch, conditions, self.negative_prompt)
        rng = self.base.require_rng(rng, size)
        if phase == self.phases[0]:
            loss = self._critic_loss(container, conditions, rng, phase)
        elif self.generator_loss == "flow_matching":
            loss = self._student_flow_matching_loss(container, conditions, rng, phase)
        else:
            loss = self._distribution_matching_loss(container, conditions, unconditional, rng, phase)
        return PipelineOutput(loss=loss, metrics={"num_samples": float(size)})

    def __call__(self, container: Any, rng: SampleRNG | None = None, **batch: Any) -> PipelineOutput:
        return self.forward(container, rng, **batch)

    def _critic_loss(self, container: Any, conditions: dict, rng: SampleRNG, phase: str) -> torch.Tensor:
        with torch.no_grad():
            x0_hat = self._student_estimate(container, conditions, rng, phase)
        x_t, sigma, noise = self._renoise(x0_hat, rng, phase)
        v = self._velocity(container, "critic", x_t, sigma, conditions)
        return self._weighted(
            {n: (v[n].float() - (noise[n] - x0_hat[n])).pow(2).flatten(1).mean(1) for n in x0_hat}
        ).mean()

    def _distribution_matching_loss(
        self, container: Any, conditions: dict, unconditional: dict | None, rng: SampleRNG, phase: str
    ) -> torch.Tensor:
        x0_hat = self._student_estimate(container, conditions, rng, phase)
        with torch.no_grad():
            detached = {n: x.detach() for n, x in x0_hat.items()}
            x_t, sigma, _ = self._renoise(detached, rng, phase)
            real = self._clean(
                x_t, sigma, self._guided_teacher(container, x_t, sigma, conditions, unconditional)
            )
            fake = self._clean(x_t, sigma, self._velocity(container, "critic", x_t, sigma, conditions))
            distance = torch.cat([(detached[n] - real[n]).abs().flatten(1) for n in detached], dim=1)
            scale = distance.mean(1).clamp_min(1e-6)
            target = {}
            for n, x in detached.items():
                grad = (fake[n] - real[n]) / scale.reshape(-1, *([1] * (x.ndim - 1)))
                target[n] = x - grad
        per_sample = {n: (x0_hat[n].float() - target[n]).pow(2).flatten(1).mean(1) for n in x0_hat}
        return 0.5 * self._weighted(per_sample).mean()

    def _student_flow_matching_loss(
        self, container: Any, conditions: dict, rng: SampleRNG, phase: str
    ) -> torch.Tensor:
        x0 = self.base.clean_state(conditions)
        sigmas = self.student_sigmas()
        k = rng.step_randint(f"{phase}_student_step", 0, self.student_steps)
        noise = self._draw_noise(rng, f"{phase}_noise", x0)
        x_k = {n: FlowMatchScheduler.add_noise(x0[n], noise[n], float(sigmas[k])) for n in x0}
        v = self._velocity(container, "predictor", x_k, sigmas[k], conditions)
        return self._weighted(
            {n: (v[n].float() - (noise[n] - x0[n])).pow(2).flatten(1).mean(1) for n in x0}
        ).mean()

    # ------------------------------------------------------------------ pieces
    def _student_estimate(self, container: Any, conditions: dict, rng: SampleRNG, phase: str) -> State:
        """Backward simulation: ``x0(x_k)`` at a keyed student step ``k``, after ``k`` Euler steps
        without gradients; the last call runs with gradients when the student trains here."""
        x0 = self.base.clean_state(conditions)
        k = rng.step_randint(f"{phase}_student_step", 0, self.student_steps)
        noise = self._draw_noise(rng, f"{phase}_start", x0)
        sigmas = self.student_sigmas()
        if k:
            x_k = self.sample(container, noise, conditions, stop_after=k)
        else:
            x_k = {n: e * sigmas[0] for n, e in noise.items()}
        sigma = sigmas[k]
        return self._clean(x_k, sigma, self._velocity(container, "predictor", x_k, sigma, conditions))

    def _renoise(self, x0: State, rng: SampleRNG, phase: str) -> tuple[State, torch.Tensor, State]:
        """Every stream of ``x0`` noised at one keyed timestep per sample, each with noise of its own."""
        scheduler: FlowMatchScheduler = self.base.scheduler
        low, high = self.dm_indices
        index = rng.per_sample(
            f"{phase}_timestep", lambda g: torch.randint(low, high, (), generator=g), "cpu"
        )
        device = next(iter(x0.values())).device
        sigma = scheduler.sigmas_for(index).to(device)
        noise = self._draw_noise(rng, f"{phase}_noise", x0)
        return {n: FlowMatchScheduler.add_noise(x0[n], noise[n], sigma) for n in x0}, sigma, noise

    def _draw_noise(self, rng: SampleRNG, purpose: str, like: Mapping[str, torch.Tensor]) -> State:
        """Keyed noise shaped like each stream of ``like``: the first stream under ``purpose``, each
        further one under ``purpose_<stream>``."""
        return {
            n: rng.randn(purpose if i == 0 else f"{purpose}_{n}", x.shape[1:], device=x.device)
            for i, (n, x) in enumerate(like.items())
        }

    def _guided_teacher(
        self, container: Any, x_t: State, sigma: torch.Tensor, conditions: Mapping[str, Any],
        unconditional: Mapping[str, Any] | None = None,
    ) -> State:  # fmt: skip
        """The teacher's velocity with classifier-free guidance, ``v_u + g (v_c - v_u)`` (``unconditional``:
        the conditions of ``v_u``; from the base pipeline when not given)."""
        v = self._velocity(container, "teacher", x_t, sigma, conditions)
        if self.guidance_scale == 1.0:
            return v
        if unconditional is None:
            unconditional = self.base.unconditional(container, conditions, conditions, self.negative_prompt)
        v_u = self._velocity(container, "teacher", x_t, sigma, unconditional)
        return {n: v_u[n] + self.guidance_scale * (v[n] - v_u[n]) for n in v}

    def _weighted(self, per_stream: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The streams' per-sample losses summed with the base pipeline's ``state_weights``
        (:func:`weighted_streams`)."""
        return weighted_streams(self.base, per_stream)

    def _as_state(self, noise: torch.Tensor | Mapping[str, torch.Tensor]) -> State:
        if isinstance(noise, Mapping):
            return dict(noise)
        streams = tuple(self.base.state_streams)
        if len(streams) != 1:
            raise ValueError(
                f"{type(self.base).__name__}'s flow state has the streams {list(streams)}: pass the noise as a "
                "mapping of one tensor per stream"
            )
        return {streams[0]: noise}

    @staticmethod
    def _clean(x_t: State, sigma: torch.Tensor | float, v: State) -> State:
        """``x_t - sigma v`` per stream (fp32): the clean estimate of a velocity prediction."""
        out = {}
        for n, x in x_t.items():
            s = torch.as_tensor(sigma, dtype=torch.float32, device=x.device)
            s = s.reshape(-1, *([1] * (x.ndim - 1))) if s.ndim else s
            out[n] = x.float() - s * v[n].float()
        return out

    def _velocity(
        self, container: Any, role: str, state: Mapping[str, torch.Tensor], sigma: torch.Tensor | float,
        conditions: Mapping[str, Any],
    ) -> State:  # fmt: skip
        """The velocity of sub-model ``role`` at ``state`` and ``sigma`` (scalar or ``[B]``), through the
        base pipeline's ``state_velocity``."""
        b = next(iter(state.values())).shape[0]
        s = torch.as_tensor(sigma, dtype=torch.float32).reshape(-1).expand(b).cpu()
        return self.base.state_velocity(container, role, state, s, conditions)


def weighted_streams(base: Any, per_stream: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The streams' per-sample losses summed with ``base``'s ``state_weights`` (default 1; a weight of 1
    leaves its term as it is, so one stream's loss is returned unchanged)."""
    weights = getattr(base, "state_weights", None) or {}
    total: torch.Tensor | None = None
    for n, loss in per_stream.items():
        weight = float(weights.get(n, 1.0))
        term = loss if weight == 1.0 else weight * loss
        total = term if total is None else total + term
    assert total is not None
    return total


def with_distillation(
    options: Mapping[str, Any],
    build_base: Callable[[dict[str, Any]], Any],
    distil: Callable[[Any, Mapping[str, Any]], DistributionMatchingDistillation],
) -> Any:
    """A container's pipeline from ``model.pipeline``: ``build_base`` of the options without ``distill``,
    wrapped by ``distil(base, distill)`` when ``distill`` is set."""
    options = dict(options)
    distill = options.pop("distill", None)
    base = build_base(options)
    return base if distill is None else distil(base, distill)


def check_distillation_models(
    sub_models: Collection[str], trainable: Collection[str], roles: Sequence[str], teachers: Sequence[str],
    *, what: str = "model.pipeline.distill",
) -> None:  # fmt: skip
    """Refuse a distillation container that lacks one of ``roles`` (its sub-model names) or trains one
    of ``teachers``, naming what is wrong (``what``: the config section, for the message)."""
    missing = [r for r in roles if r not in sub_models]
    if missing:
        raise ValueError(
            f"{what} needs the sub-models {list(roles)}: add {missing} under model.models (the teacher with "
            "freeze: true; the student and the critic from the teacher's weights)"
        )
    trained = [r for r in teachers if r in trainable]
    if trained:
        raise ValueError(f"{what}: the teacher {trained} must be frozen (freeze: true)")


def distillation_architecture_problems(
    architectures: Mapping[str, Mapping[str, Any] | None], teacher_of: Mapping[str, str]
) -> dict[str, str]:
    """Why a student or critic cannot be distilled against its teacher, by sub-model name.

    ``architectures`` holds each sub-model's architecture as a flat mapping (its model id and the config
    keys that define its modules; None: not known here, e.g. no ``config.json`` to read, and not judged);
    ``teacher_of`` maps each student and critic to its teacher. DMD2 starts the student and the critic
    from the teacher's weights, and compares the critic's score with the teacher's at the same inputs, so
    each must have its teacher's architecture: a sub-model whose mapping differs is named with every
    differing key and both values."""
    problems: dict[str, str] = {}
    for role, teacher in teacher_of.items():
        mine, theirs = architectures.get(role), architectures.get(teacher)
        if mine is None or theirs is None:
            continue
        differing = [k for k in sorted({*mine, *theirs}) if mine.get(k) != theirs.get(k)]
        if differing:
            keys = ", ".join(
                f"{k} ({role}: {mine.get(k)!r}, {teacher}: {theirs.get(k)!r})" for k in differing
            )
            problems[role] = (
                f"`{role}` is not an architecture of its teacher `{teacher}`: {keys}. A distillation starts the "
                "student and the critic from the teacher's weights and compares their scores with the teacher's "
                f"at the same inputs: give `{role}` the teacher's model id and config (e.g. its from_pretrained)"
            )
    return problems


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


__all__ = [
    "DistributionMatchingDistillation",
    "FlowState",
    "GeneratorLoss",
    "check_distillation_models",
    "distillation_architecture_problems",
    "weighted_streams",
    "with_distillation",
]
