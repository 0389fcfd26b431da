"""``SampleRNG``: random draws keyed by what they are for, never by rank or by earlier draws.

A training draw that changes the loss (noise, timestep / sigma, expert routing, condition dropout)
must come out the same whatever the run's layout: data-parallel size, context-parallel split,
gradient accumulation, micro batch size, or a resume in between. So every draw here is a pure
function of a key:

    per sample:  (seed, optimizer step, global sample index, purpose)
    per step:    (seed, optimizer step, purpose)

``global sample index`` is the sample's place in the run's global order (the data loader's
``sample_ids``: samples of earlier steps and epochs count before it), the same number on every
layout. A micro-batch's draws are the per-sample draws of its samples, stacked in batch order, so a
sample gets the same noise whether it trains in a micro-batch of 1 on one of four ranks or in a
micro-batch of 4 on one rank. Ranks of one context-parallel group hold the same micro-batch and so
draw the same. ``purpose`` (a short string such as ``"noise"``) keeps the streams of different
draws apart.

Per-sample draws suit anything that varies per sample; a draw that must be shared by the whole
optimizer step (e.g. one timestep that routes every rank's micro-batch to the same expert) uses the
per-step stream, which every rank and micro-batch of the step sees alike.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence

import torch

__all__ = ["SampleRNG", "key_seed"]


def key_seed(*parts: int | str) -> int:
    """A 63-bit seed that depends only on ``parts`` (ints and strings), for ``Generator.manual_seed``."""
    digest = hashlib.blake2b(digest_size=8)
    for part in parts:
        if isinstance(part, str):
            data = part.encode()
            digest.update(b"s" + struct.pack("<q", len(data)) + data)
        else:
            digest.update(b"i" + struct.pack("<q", int(part)))
    return int.from_bytes(digest.digest(), "little") >> 1


class SampleRNG:
    """The random draws of one micro-batch, keyed by (seed, step, global sample index, purpose).

    Args:
        seed: the run's seed (``training.seed``).
        step: the optimizer step this micro-batch trains (0-based, counted over the whole run).
        sample_ids: global sample index of each sample of the micro-batch, in batch order.
        device: where draws are made by default (a generator lives on one device; CPU and CUDA
            streams differ, so a run keeps its device type).

    Example:
        >>> rng = SampleRNG(seed=0, step=3, sample_ids=[8, 9])
        >>> rng.randn("noise", (4,)).shape
        torch.Size([2, 4])
    """

    def __init__(
        self,
        *,
        seed: int,
        step: int,
        sample_ids: Sequence[int] | torch.Tensor,
        device: torch.device | str | None = None,
    ) -> None:
        ids = (
            sample_ids.flatten().tolist()
            if isinstance(sample_ids, torch.Tensor)
            else [int(i) for i in sample_ids]
        )
        if not ids:
            raise ValueError("SampleRNG: sample_ids is empty (a micro-batch has at least one sample)")
        self.seed, self.step, self.sample_ids = int(seed), int(step), ids
        self.device = torch.device(device) if device is not None else torch.device("cpu")

    @classmethod
    def for_batch(
        cls, batch_size: int, *, seed: int = 0, step: int = 0, device: torch.device | str | None = None
    ) -> SampleRNG:
        """Keys for a stand-alone batch (samples ``0..batch_size-1`` of step ``step``): tests, notebooks."""
        return cls(seed=seed, step=step, sample_ids=range(batch_size), device=device)

    def __len__(self) -> int:
        return len(self.sample_ids)

    def __repr__(self) -> str:
        return f"SampleRNG(seed={self.seed}, step={self.step}, sample_ids={self.sample_ids})"

    # ------------------------------------------------------------ generators
    def sample_generators(
        self, purpose: str, device: torch.device | str | None = None
    ) -> list[torch.Generator]:
        """One generator per sample for ``purpose``, in batch order."""
        return [
            self._generator(device, self.seed, "sample", self.step, sample, purpose)
            for sample in self.sample_ids
        ]

    def step_generator(self, purpose: str, device: torch.device | str | None = None) -> torch.Generator:
        """The generator shared by every sample, micro-batch and rank of this optimizer step."""
        return self._generator(device, self.seed, "step", self.step, purpose)

    def micro_batch_seed(self) -> int:
        """A seed for code that draws from the global RNG (e.g. dropout inside a model): keyed by the
        step and this micro-batch's first sample, so it is layout-free at a fixed micro batch size."""
        return key_seed(self.seed, "micro_batch", self.step, self.sample_ids[0])

    def _generator(self, device: torch.device | str | None, *key: int | str) -> torch.Generator:
        generator = torch.Generator(device=torch.device(device) if device is not None else self.device)
        return generator.manual_seed(key_seed(*key))

    # ------------------------------------------------------------ per-sample draws
    def per_sample(
        self,
        purpose: str,
        draw: Callable[[torch.Generator], torch.Tensor],
        device: torch.device | str | None = None,
    ) -> torch.Tensor:
        """``[B, ...]``: ``draw(generator)`` once per sample with that sample's generator, stacked.

        Any sampler that takes a ``generator`` (``torch.rand``, a sigma distribution...) becomes a
        per-sample draw: each sample's value depends on its own key only.
        """
        return torch.stack([draw(g) for g in self.sample_generators(purpose, device)])

    def randn(
        self,
        purpose: str,
        shape: Sequence[int] = (),
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> torch.Tensor:
        """``[B, *shape]`` standard normal (noise): sample ``i``'s slice from its own key, drawn in fp32."""
        where = torch.device(device) if device is not None else self.device
        draw = lambda g: torch.randn(tuple(shape), generator=g, device=where)  # noqa: E731
        return self.per_sample(purpose, draw, where).to(dtype)

    # ------------------------------------------------------------ per-step draws
    def step_randint(self, purpose: str, low: int, high: int) -> int:
        """One integer in ``[low, high)`` for the whole optimizer step (drawn on CPU)."""
        generator = self.step_generator(purpose, "cpu")
        return int(torch.randint(low, high, (1,), generator=generator).item())
