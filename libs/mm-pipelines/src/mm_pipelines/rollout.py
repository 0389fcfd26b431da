"""Rollouts for reward fine-tuning: a flow-match sampler run as a stochastic process (an SDE with the same
marginals as the sampler's ODE), recording every step's state and the Gaussian log-probability of each
transition (Flow-GRPO, Liu et al. 2025, "Flow-GRPO: Training Flow Matching Models via Online RL").

The maths, on the flow-match convention ``x_s = (1 - s) x0 + s eps`` and velocity ``v = eps - x0``. The
sampler walks a decreasing sigma schedule ``s_0 > s_1 > ... > s_K = 0``. Its ODE step is the Euler step
``x' = x + v dt`` with ``dt = s_{k+1} - s_k < 0``. The reverse-time SDE with the same marginals and a
diffusion coefficient ``g_k`` replaces it by a Gaussian transition

    mean = x + [v + g_k^2 / (2 s_k) * (x + (1 - s_k) v)] dt
    std  = g_k * sqrt(-dt)
    x'   = mean + std * z,             z ~ N(0, I)

with ``g_k = a * sqrt(s_k / (1 - s_k))`` and the noise level ``a`` (``a = 0`` is the ODE step). At
``s_k = 1`` (the top of a schedule from pure noise) ``1 - s_k`` is 0; the step takes ``1 - s_1`` there (the
schedule's second sigma), as the published implementation does. The log-probability of a transition is
the Gaussian log-density of ``x'`` under ``N(mean, std^2)``, averaged over the sample's elements (not
summed: the per-element mean keeps the importance ratio ``exp(log p - log p_old)`` of order 1 whatever the
clip's size, as in Flow-GRPO):

    log p(x' | x) = mean_elements[ -(x' - mean)^2 / (2 std^2) - log std - log(2 pi) / 2 ]

:func:`sde_rollout` runs the sampler from a start noise with the noise of each step supplied by the caller
(keyed draws: ``mm_pipelines.FlowGRPO`` keys them by step, prompt and group index), without gradients, and
returns every state and every transition's log-probability (:class:`Rollout`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

Velocity = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
"""``velocity(x [N, ...], sigma [N], step k)``: the policy's velocity at the state ``x`` of step ``k``."""


@dataclass
class Rollout:
    """Samples drawn by :func:`sde_rollout`.

    Attributes:
        states: ``[K + 1, N, ...]``: the start ``x_0 = s_0 * noise``, every step's result, the last the
            sample (fp32).
        log_probs: ``[K, N]``: the log-probability of each transition ``x_k -> x_{k+1}`` (module docstring).
        sigmas: ``[K + 1]``: the schedule, decreasing, ending in 0.
    """

    states: torch.Tensor
    log_probs: torch.Tensor
    sigmas: torch.Tensor

    @property
    def samples(self) -> torch.Tensor:
        """The clean samples ``[N, ...]``: the last state."""
        return self.states[-1]


def sde_coefficient(sigmas: torch.Tensor, k: int, noise_level: float) -> float:
    """``g_k = a * sqrt(s_k / (1 - s_k))`` of step ``k`` of the schedule ``sigmas`` (``1 - s_1`` where
    ``s_k = 1``)."""
    s = float(sigmas[k])
    gap = 1.0 - s if s < 1.0 else 1.0 - float(sigmas[1])
    if gap <= 0:
        raise ValueError(
            f"the SDE step needs a sigma below 1 after the first, got the schedule {sigmas.tolist()}"
        )
    return noise_level * math.sqrt(s / gap)


def sde_transition(
    x: torch.Tensor, velocity: torch.Tensor, sigmas: torch.Tensor, k: int, noise_level: float
) -> tuple[torch.Tensor, float]:
    """The Gaussian transition of step ``k`` from ``x`` with the model's ``velocity`` (both ``[N, ...]``):
    its mean (fp32, ``[N, ...]``) and its standard deviation (a number: every element and sample alike)."""
    s, dt = float(sigmas[k]), float(sigmas[k + 1] - sigmas[k])
    if dt >= 0:
        raise ValueError(f"the schedule must decrease: sigma {s} then {float(sigmas[k + 1])} at step {k}")
    g = sde_coefficient(sigmas, k, noise_level)
    x, v = x.float(), velocity.float()
    mean = x + (v + g * g / (2 * s) * (x + (1 - s) * v)) * dt
    return mean, g * math.sqrt(-dt)


def transition_log_prob(x_next: torch.Tensor, mean: torch.Tensor, std: float) -> torch.Tensor:
    """``[N]``: the Gaussian log-density of ``x_next`` under ``N(mean, std^2)``, averaged over each sample's
    elements (module docstring); differentiable in ``mean``."""
    if not std > 0:
        raise ValueError(f"a transition's log-probability needs a positive std (noise_level > 0), got {std}")
    density = -((x_next.float() - mean) ** 2) / (2 * std * std) - math.log(std) - 0.5 * math.log(2 * math.pi)
    return density.flatten(1).mean(dim=1)


@torch.no_grad()
def sde_rollout(
    velocity: Velocity,
    start: torch.Tensor,
    step_noise: Callable[[int], torch.Tensor],
    sigmas: torch.Tensor,
    noise_level: float,
) -> Rollout:
    """Sample from ``sigmas[0] * start`` (``start`` the noise ``[N, ...]``) down ``sigmas`` (decreasing, ending
    in 0) with the SDE steps of the module docstring; ``step_noise(k)`` gives step ``k``'s ``z`` ``[N, ...]``.
    ``velocity(x, sigma [N], k)`` is the policy's."""
    sigmas = sigmas.double().cpu()
    x = start.float() * float(sigmas[0])
    states, log_probs = [x], []
    for k in range(len(sigmas) - 1):
        sigma = torch.full((x.shape[0],), float(sigmas[k]), dtype=torch.float32)
        mean, std = sde_transition(x, velocity(x, sigma, k), sigmas, k, noise_level)
        x = mean + std * step_noise(k).to(mean.device, torch.float32)
        states.append(x)
        log_probs.append(transition_log_prob(x, mean, std))
    return Rollout(torch.stack(states), torch.stack(log_probs), sigmas)


@torch.no_grad()
def ode_rollout(velocity: Velocity, start: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """The clean samples ``[N, ...]`` (fp32) of the sampler's ODE (Euler steps ``x' = x + v dt``, the SDE with
    ``a = 0``) from ``sigmas[0] * start`` down ``sigmas`` (decreasing, ending in 0): DiffusionNFT's rollouts,
    deterministic given the start noise."""
    sigmas = sigmas.double().cpu()
    x = start.float() * float(sigmas[0])
    for k in range(len(sigmas) - 1):
        sigma = torch.full((x.shape[0],), float(sigmas[k]), dtype=torch.float32)
        x = x + velocity(x, sigma, k).float() * float(sigmas[k + 1] - sigmas[k])
    return x


__all__ = [
    "Rollout",
    "Velocity",
    "ode_rollout",
    "sde_coefficient",
    "sde_rollout",
    "sde_transition",
    "transition_log_prob",
]
