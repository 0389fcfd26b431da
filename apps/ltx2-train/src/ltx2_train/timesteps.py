"""LTX-2 training sigmas: a shifted logit-normal whose shift grows linearly with the token count.

``sigma = sigmoid(N(0, 1) * std + shift(n))`` per sample, with ``shift(n)`` the line through
``(min_tokens, min_shift) = (1024, 0.95)`` and ``(max_tokens, max_shift) = (4096, 2.05)``
(extrapolated outside), ``n`` = video tokens per sample. Longer / larger clips get more noise.
The ``uniform`` mode draws ``sigma ~ U(0, 1)`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from mm_pipelines import SampleRNG

from ltx2_train.config_schema import SAMPLING_MODES as MODES


@dataclass(frozen=True)
class SigmaSampler:
    """Draws one sigma in (0, 1) per sample."""

    mode: str = "shifted_logit_normal"
    std: float = 1.0
    min_tokens: int = 1024
    min_shift: float = 0.95
    max_tokens: int = 4096
    max_shift: float = 2.05

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"model.pipeline.timestep_sampling={self.mode!r}: expected one of {list(MODES)}")
        if self.max_tokens == self.min_tokens:
            raise ValueError("model.pipeline: shift_max_tokens must differ from shift_min_tokens")
        if self.std <= 0:
            raise ValueError(f"model.pipeline.sigma_std={self.std}: expected > 0")

    def shift(self, num_tokens: int) -> float:
        """The logit-normal mean for ``num_tokens`` tokens (linear through the two anchor points)."""
        slope = (self.max_shift - self.min_shift) / (self.max_tokens - self.min_tokens)
        return self.min_shift + slope * (num_tokens - self.min_tokens)

    def sample(
        self,
        batch: int,
        num_tokens: int,
        *,
        generator: torch.Generator | None = None,
        device: torch.device | str | None = None,
    ) -> torch.Tensor:
        """``[batch]`` float32 sigmas for samples of ``num_tokens`` video tokens each."""
        if self.mode == "uniform":
            return torch.rand(batch, generator=generator, device=device)
        normal = torch.randn(batch, generator=generator, device=device)
        return torch.sigmoid(normal * self.std + self.shift(num_tokens))

    def sample_keyed(
        self,
        rng: SampleRNG,
        num_tokens: int,
        *,
        device: torch.device | str | None = None,
        purpose: str = "sigma",
    ) -> torch.Tensor:
        """``[B]`` float32 sigmas, sample ``i``'s from its own key (``purpose``: ``"sigma"``, or
        ``"audio_sigma"`` for an independent audio draw): the same at any micro-batch split or layout."""
        return rng.per_sample(
            purpose, lambda g: self.sample(1, num_tokens, generator=g, device=device)[0], device
        )
