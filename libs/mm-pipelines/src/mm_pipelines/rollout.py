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

**Several streams** (a pipeline's flow state, ``state_streams``: LTX-2's ``video`` and ``audio``). Every
function here takes a tensor (one stream) or a mapping of one tensor per stream (a *flow*), and answers in the
same form. All streams move at one sigma per step, so their transitions share ``std``; each stream's mean
is the formula above with its own velocity, and its noise is its own draw. The joint transition of the
streams is the product of their Gaussians (independent noise), so its log-density is the sum over streams
of their log-densities; on the per-element convention above the log-probability of the joint transition is
that sum divided by the number of elements of all streams, i.e. the mean of the log-density over every
element of every stream:

    log p(x' | x) = sum_streams sum_elements[...] / sum_streams elements

This keeps the quantity a (rescaled) log-density of the joint transition, so the importance ratio
``exp(log p - log p_old)`` stays the joint ratio's per-element geometric mean, of order 1 whatever the
streams' sizes. A per-stream weight (``state_weights``, as the training loss weights the audio) would
instead turn it into a product of the streams' ratios raised to arbitrary powers, which is no longer the
ratio of one policy's transition densities; the weights act in the losses that are sums of per-stream
errors instead (DiffusionNFT's ``L+-``). With one stream every quantity is the one-stream formula, bit for
bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

Flow = TypeVar("Flow", torch.Tensor, Mapping[str, torch.Tensor])
"""A sampler state: one tensor ``[N, ...]`` (one stream) or one tensor per stream (module docstring)."""
Velocity = Callable[[Any, torch.Tensor, int], Any]
"""``velocity(x, sigma [N], step k)``: the policy's velocity at the state ``x`` of step ``k``, in ``x``'s form
(a tensor ``[N, ...]``, or one per stream)."""


@dataclass
class Rollout:
    """Samples drawn by :func:`sde_rollout`.

    Attributes:
        states: ``[K + 1, N, ...]``: the start ``x_0 = s_0 * noise``, every step's result, the last the
            sample (fp32); for a state of several streams, one such tensor per stream.
        log_probs: ``[K, N]``: the log-probability of each transition ``x_k -> x_{k+1}`` (module docstring).
        sigmas: ``[K + 1]``: the schedule, decreasing, ending in 0.
    """

    states: Any
    log_probs: torch.Tensor
    sigmas: torch.Tensor

    def state(self, k: int) -> Any:
        """The state ``x_k`` ``[N, ...]`` (one per stream for several streams)."""
        return _apply(lambda x: x[k], self.states)

    @property
    def samples(self) -> Any:
        """The clean samples ``[N, ...]`` (one per stream for several streams): the last state."""
        return self.state(-1)


def _apply(fn: Callable[[torch.Tensor], torch.Tensor], x: Flow) -> Flow:
    """``fn`` of a tensor, or of each stream of a mapping (the result a dict in the streams' order)."""
    return {n: fn(v) for n, v in x.items()} if isinstance(x, Mapping) else fn(x)


def element_mean(per_element: Flow) -> torch.Tensor:
    """``[N]``: each sample's mean over every element of every stream (module docstring); a tensor's own
    ``flatten(1).mean(1)`` for one stream."""
    if not isinstance(per_element, Mapping):
        return per_element.flatten(1).mean(dim=1)
    parts = [v.flatten(1) for v in per_element.values()]
    return (parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)).mean(dim=1)


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


def state_transition(
    x: Flow, velocity: Flow, sigmas: torch.Tensor, k: int, noise_level: float
) -> tuple[Flow, float]:
    """:func:`sde_transition` of a state of one or several streams: each stream's mean (fp32, in ``x``'s
    form) and the one standard deviation they share (every stream moves at the same sigma)."""
    if not isinstance(x, Mapping):
        return sde_transition(x, velocity, sigmas, k, noise_level)
    means, std = {}, 0.0
    for n in x:
        means[n], std = sde_transition(x[n], velocity[n], sigmas, k, noise_level)
    return means, std


def transition_log_prob(x_next: Flow, mean: Flow, std: float) -> torch.Tensor:
    """``[N]``: the Gaussian log-density of ``x_next`` under ``N(mean, std^2)``, averaged over each sample's
    elements (of every stream: module docstring); differentiable in ``mean``."""
    if not std > 0:
        raise ValueError(f"a transition's log-probability needs a positive std (noise_level > 0), got {std}")

    def density(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return -((x.float() - m) ** 2) / (2 * std * std) - math.log(std) - 0.5 * math.log(2 * math.pi)

    if not isinstance(mean, Mapping):
        return element_mean(density(x_next, mean))
    return element_mean({n: density(x_next[n], mean[n]) for n in mean})


@torch.no_grad()
def sde_rollout(
    velocity: Velocity,
    start: Flow,
    step_noise: Callable[[int], Flow],
    sigmas: torch.Tensor,
    noise_level: float,
) -> Rollout:
    """Sample from ``sigmas[0] * start`` (``start`` the noise ``[N, ...]``, or one per stream) down ``sigmas``
    (decreasing, ending in 0) with the SDE steps of the module docstring; ``step_noise(k)`` gives step
    ``k``'s ``z`` in ``start``'s form. ``velocity(x, sigma [N], k)`` is the policy's."""
    sigmas = sigmas.double().cpu()
    x = _apply(lambda n: n.float() * float(sigmas[0]), start)
    states, log_probs = [x], []
    for k in range(len(sigmas) - 1):
        sigma = torch.full((_size(x),), float(sigmas[k]), dtype=torch.float32)
        mean, std = state_transition(x, velocity(x, sigma, k), sigmas, k, noise_level)
        z = step_noise(k)
        if isinstance(mean, Mapping):
            x = {n: m + std * z[n].to(m.device, torch.float32) for n, m in mean.items()}
        else:
            x = mean + std * z.to(mean.device, torch.float32)
        states.append(x)
        log_probs.append(transition_log_prob(x, mean, std))
    if isinstance(x, Mapping):
        stacked: Any = {n: torch.stack([s[n] for s in states]) for n in x}
    else:
        stacked = torch.stack(states)
    return Rollout(stacked, torch.stack(log_probs), sigmas)


@torch.no_grad()
def ode_rollout(velocity: Velocity, start: Flow, sigmas: torch.Tensor) -> Flow:
    """The clean samples ``[N, ...]`` (fp32; one per stream for several) of the sampler's ODE (Euler steps
    ``x' = x + v dt``, the SDE with ``a = 0``) from ``sigmas[0] * start`` down ``sigmas`` (decreasing, ending
    in 0): DiffusionNFT's rollouts, deterministic given the start noise."""
    sigmas = sigmas.double().cpu()
    x = _apply(lambda n: n.float() * float(sigmas[0]), start)
    for k in range(len(sigmas) - 1):
        sigma = torch.full((_size(x),), float(sigmas[k]), dtype=torch.float32)
        v, dt = velocity(x, sigma, k), float(sigmas[k + 1] - sigmas[k])
        x = {n: x[n] + v[n].float() * dt for n in x} if isinstance(x, Mapping) else x + v.float() * dt
    return x


def _size(x: Flow) -> int:
    return (next(iter(x.values())) if isinstance(x, Mapping) else x).shape[0]


__all__ = [
    "Flow",
    "Rollout",
    "Velocity",
    "element_mean",
    "ode_rollout",
    "sde_coefficient",
    "sde_rollout",
    "sde_transition",
    "state_transition",
    "transition_log_prob",
]
