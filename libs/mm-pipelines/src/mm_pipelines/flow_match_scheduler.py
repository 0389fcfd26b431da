"""Wan flow-match scheduler: the training sigma grid, timestep sampling, noising, target, weighting.

The grid is a numeric contract (docs/DESIGN.md "The flow-match grid"); it is not diffusers'
``FlowMatchEulerDiscreteScheduler`` grid (the endpoint convention differs):

    s      = linspace(sigma_max, sigma_min, N)            (N+1 points, last dropped, with extra_one_step)
    sigma' = shift * s / (1 + (shift - 1) * s)
    t      = N * sigma'                                     (N = num_train_timesteps = 1000)

Training draws grid indices uniformly in ``[min_boundary*N, max_boundary*N)`` (per sample, or one
per optimizer step, keyed by :class:`~mm_pipelines.SampleRNG`: :meth:`FlowMatchScheduler.draw_indices`),
noises ``x_t = (1 - sigma) x0 + sigma * eps``, regresses ``eps - x0`` and weights the
fp32 MSE by ``w(t) = (y - min y) * N / sum(y - min y)``, ``y = exp(-2 ((t - N/2) / N)^2)``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from .keyed_random import SampleRNG

DEFAULT_SIGMA_MIN = 0.003 / 1.002


def shift_sigmas(sigmas: torch.Tensor, shift: float) -> torch.Tensor:
    """Apply the flow-match time shift ``shift * s / (1 + (shift - 1) * s)``."""
    return shift * sigmas / (1.0 + (shift - 1.0) * sigmas)


def boundary_index(boundary: float, num_train_timesteps: int) -> int:
    """Grid index of a boundary given as a fraction of the grid: ``floor(boundary * N)``, tolerant to
    float noise (``0.417 * 1000`` is 416.99999999999994 -> 417). A boundary between two grid points
    goes to the lower one. The training range ``[min_boundary, max_boundary)`` is cut here, and so
    must be anything else that splits the grid at a boundary (e.g. routing between models)."""
    return math.floor(boundary * num_train_timesteps + 1e-9)


def _sigma_grid(num: int, sigma_max: float, sigma_min: float, shift: float, extra: bool) -> torch.Tensor:
    """Shifted float64 sigma grid with ``num`` points, largest sigma first."""
    points = num + 1 if extra else num
    base = torch.linspace(sigma_max, sigma_min, points, dtype=torch.float64)[:num]
    return shift_sigmas(base, shift)


class FlowMatchScheduler:
    """Flow-match training scheduler with the Wan sigma grid and an Euler sampling step.

    Args:
        num_train_timesteps: grid size N; timesteps are ``N * sigma``.
        shift: time shift (> 0); 3.0 is Wan's default.
        sigma_min: smallest unshifted sigma, in ``[0, sigma_max)``.
        sigma_max: largest unshifted sigma, in ``(sigma_min, 1]``.
        extra_one_step: take N+1 linspace points and drop the last.
        min_boundary: lower end of the sampled index range as a fraction of N (:func:`boundary_index`).
        max_boundary: upper end (exclusive) of the sampled index range as a fraction of N.
        weighting: apply the Gaussian-in-t loss weight (``False`` -> weight 1).
    """

    def __init__(
        self,
        num_train_timesteps: int = 1000,
        shift: float = 3.0,
        sigma_min: float = DEFAULT_SIGMA_MIN,
        sigma_max: float = 1.0,
        extra_one_step: bool = False,
        min_boundary: float = 0.0,
        max_boundary: float = 1.0,
        weighting: bool = True,
    ) -> None:
        _validate(num_train_timesteps, shift, sigma_min, sigma_max, min_boundary, max_boundary)
        self.num_train_timesteps = num_train_timesteps
        self.shift = float(shift)
        self.sigma_min = float(sigma_min)
        self.sigma_max = float(sigma_max)
        self.extra_one_step = extra_one_step
        self.min_boundary = float(min_boundary)
        self.max_boundary = float(max_boundary)
        self.weighting = weighting
        n = num_train_timesteps
        grid = _sigma_grid(n, self.sigma_max, self.sigma_min, self.shift, extra_one_step)
        self.sigmas64 = grid
        self.timesteps64 = grid * n
        self.weights64 = _gaussian_weights(self.timesteps64, n)
        self.sigmas = grid.float()
        self.timesteps = self.timesteps64.float()
        self.weights = self.weights64.float()
        self.index_range = (boundary_index(min_boundary, n), boundary_index(max_boundary, n))
        self.inference_sigmas: torch.Tensor | None = None
        self.inference_timesteps: torch.Tensor | None = None

    # ----------------------------------------------------------------- training
    def sample_indices(
        self, batch_size: int, generator: torch.Generator | None = None, per_sample: bool = False
    ) -> torch.Tensor:
        """Grid indices, uniform in ``[min_boundary*N, max_boundary*N)``; shape ``[batch_size]``.

        By default one index is drawn for the whole batch and repeated; ``per_sample`` draws
        one per sample. Indices are drawn on the generator's device (CPU by default). Training
        draws through :meth:`draw_indices`, which keys each draw by sample or step.
        """
        if batch_size < 1:
            raise ValueError(f"sample_indices: batch_size must be >= 1, got {batch_size}")
        low, high = self.index_range
        device = generator.device if generator is not None else torch.device("cpu")
        count = batch_size if per_sample else 1
        idx = torch.randint(low, high, (count,), generator=generator, device=device)
        return idx.cpu().expand(batch_size).clone()

    def draw_indices(self, rng: SampleRNG, per: Literal["sample", "step"] = "sample") -> torch.Tensor:
        """Training grid indices ``[B]`` keyed by ``rng``: one per sample (purpose ``"timestep"``),
        or one for the whole optimizer step, shared by every micro-batch and rank (``per="step"``)."""
        if per == "sample":
            return torch.cat([self.sample_indices(1, g) for g in rng.sample_generators("timestep", "cpu")])
        if per == "step":
            return self.sample_indices(len(rng), rng.step_generator("timestep", "cpu"))
        raise ValueError(f"draw_indices: per={per!r} is not one of ['sample', 'step']")

    def spaced_indices(self, count: int) -> torch.Tensor:
        """``count`` fixed grid indices evenly spread over the training range ``[low, high)``: the
        middles of ``count`` equal parts (``low + (high - low) * (k + 1/2) / count``, floored), for
        a validation loss at the same timesteps every time."""
        if count < 1:
            raise ValueError(f"spaced_indices: count must be >= 1, got {count}")
        low, high = self.index_range
        positions = (torch.arange(count, dtype=torch.float64) + 0.5) * (high - low) / count
        return (low + positions.floor()).long()

    def sigmas_for(self, indices: torch.Tensor) -> torch.Tensor:
        """Shifted sigmas (float32) at grid ``indices``."""
        return self.sigmas[self._check_indices(indices)]

    def timesteps_for(self, indices: torch.Tensor) -> torch.Tensor:
        """Timesteps ``N * sigma`` (float32) at grid ``indices``."""
        return self.timesteps[self._check_indices(indices)]

    def weights_for(self, indices: torch.Tensor) -> torch.Tensor:
        """Loss weights (float32) at grid ``indices``; ones when weighting is off."""
        w = self.weights[self._check_indices(indices)]
        return w if self.weighting else torch.ones_like(w)

    def training_weight(self, timesteps: torch.Tensor) -> torch.Tensor:
        """Loss weights for ``timesteps``, looked up at the nearest grid timestep."""
        t = torch.as_tensor(timesteps, dtype=torch.float64).cpu()
        nearest = (t.reshape(-1, 1) - self.timesteps64.reshape(1, -1)).abs().argmin(dim=1)
        return self.weights_for(nearest).reshape(t.shape)

    @staticmethod
    def add_noise(x0: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor | float) -> torch.Tensor:
        """``(1 - sigma) * x0 + sigma * noise`` with ``sigma`` (scalar or ``[B]``) broadcast over
        ``[B, ...]``; computed in fp32, returned in ``x0.dtype``."""
        if x0.shape != noise.shape:
            raise ValueError(f"add_noise: x0 shape {tuple(x0.shape)} != noise shape {tuple(noise.shape)}")
        s = _broadcast_sigma(sigma, x0)
        return ((1.0 - s) * x0.float() + s * noise.float()).to(x0.dtype)

    @staticmethod
    def training_target(x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """The velocity target ``noise - x0`` in fp32."""
        return noise.float() - x0.float()

    def _check_indices(self, indices: torch.Tensor) -> torch.Tensor:
        idx = torch.as_tensor(indices, dtype=torch.long).cpu()
        if idx.numel() and (idx.min() < 0 or idx.max() >= self.num_train_timesteps):
            raise IndexError(
                f"grid indices must lie in [0, {self.num_train_timesteps}); "
                f"got min {int(idx.min())}, max {int(idx.max())}"
            )
        return idx

    # ---------------------------------------------------------------- inference
    def set_inference_timesteps(self, num_steps: int, shift: float | None = None) -> torch.Tensor:
        """Build ``num_steps`` sampling sigmas on the same convention (plus a final 0).

        Sets ``inference_sigmas`` (``num_steps + 1`` values ending in 0) and
        ``inference_timesteps`` (``num_steps`` values) and returns the timesteps.
        """
        if num_steps < 1:
            raise ValueError(f"set_inference_timesteps: num_steps must be >= 1, got {num_steps}")
        s = self.shift if shift is None else float(shift)
        if s <= 0:
            raise ValueError(f"set_inference_timesteps: shift must be > 0, got {s}")
        grid = _sigma_grid(num_steps, self.sigma_max, self.sigma_min, s, self.extra_one_step)
        self.inference_sigmas = torch.cat([grid, grid.new_zeros(1)]).float()
        self.inference_timesteps = (grid * self.num_train_timesteps).float()
        return self.inference_timesteps

    @staticmethod
    def step(
        model_output: torch.Tensor,
        sigma: torch.Tensor | float,
        sigma_next: torch.Tensor | float,
        sample: torch.Tensor,
    ) -> torch.Tensor:
        """One Euler step ``x + (sigma_next - sigma) * v``; fp32 math, returned in ``sample.dtype``."""
        ds = _broadcast_sigma(sigma_next, sample) - _broadcast_sigma(sigma, sample)
        return (sample.float() + ds * model_output.float()).to(sample.dtype)


def _gaussian_weights(timesteps: torch.Tensor, n: int) -> torch.Tensor:
    """``(y - min y) * n / sum(y - min y)`` with ``y = exp(-2 ((t - n/2) / n)^2)``."""
    y = torch.exp(-2.0 * ((timesteps - n / 2) / n) ** 2)
    shifted = y - y.min()
    total = shifted.sum()
    if total <= 0:
        return torch.ones_like(y)
    return shifted * n / total


def _broadcast_sigma(sigma: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
    """Sigma as fp32 on ``like``'s device, shaped ``[B, 1, ...]`` (or a scalar)."""
    s = torch.as_tensor(sigma, dtype=torch.float32, device=like.device)
    if s.ndim == 0:
        return s
    if s.ndim != 1 or s.shape[0] != like.shape[0]:
        raise ValueError(f"sigma must be a scalar or shape [{like.shape[0]}], got shape {tuple(s.shape)}")
    return s.reshape(-1, *([1] * (like.ndim - 1)))


def _validate(n: int, shift: float, smin: float, smax: float, bmin: float, bmax: float) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"FlowMatchScheduler: num_train_timesteps must be a positive int, got {n!r}")
    if not shift > 0:
        raise ValueError(f"FlowMatchScheduler: shift must be > 0, got {shift!r}")
    if not 0.0 <= smin < smax <= 1.0:
        raise ValueError(
            f"FlowMatchScheduler: need 0 <= sigma_min < sigma_max <= 1, got sigma_min={smin!r}, sigma_max={smax!r}"
        )
    if not 0.0 <= bmin < bmax <= 1.0:
        raise ValueError(
            f"FlowMatchScheduler: need 0 <= min_boundary < max_boundary <= 1, "
            f"got min_boundary={bmin!r}, max_boundary={bmax!r}"
        )
    if boundary_index(bmin, n) >= boundary_index(bmax, n):
        raise ValueError(
            f"FlowMatchScheduler: boundaries [{bmin}, {bmax}) select no grid index for num_train_timesteps={n}"
        )
