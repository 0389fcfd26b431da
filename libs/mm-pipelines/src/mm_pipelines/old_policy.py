"""DiffusionNFT's old policy: an exponential moving average of the policy's trainable parameters, swapped into
the policy for the forwards that need the old policy (the rollouts and ``v_old`` of the loss).

What is held: one fp32 copy of every *trainable* parameter of the container (with a LoRA policy: of the
adapters only, a few MB; with a full-weight policy: a full fp32 copy of the trained weights), on each rank
its own shards under FSDP2 (a DTensor's local shard: the update is elementwise, no communication). While the
old policy is swapped in, the current values wait in one more copy of the same size, freed on swapping back.
No third copy of the base weights: the frozen reference is a sub-model or the base with the adapters off.

The schedule, per optimizer step ``n`` (counted over the run; ``w_n`` the weights entering step ``n``)::

    old_first = w_first                                  # the first step this object sees
    old_n     = decay_n * old_{n-1} + (1 - decay_n) * w_n,   decay_n = min(decay_ramp * n, decay_max)

(DiffusionNFT's public schedule: the old policy follows the policy closely at first and lags more as the run
goes on). The update runs once per optimizer step, at its first micro-batch (:meth:`OldPolicyEMA.advance`),
so every micro-batch, rank and layout of a step sees the same old policy.

Under FSDP2 a parameter's registered tensor is its sharded DTensor only while resharded; before reading
or writing the shards, every FSDP module of the container is resharded (``FSDPModule.reshard``: a module
kept unsharded after a forward, as FSDP2 keeps the root, would otherwise run on the values gathered
before the swap), and again after writing, so that the next forward gathers the swapped values.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor


class OldPolicyEMA:
    """The old policy of a container's trainable parameters (module docstring)."""

    def __init__(self, *, decay_ramp: float, decay_max: float) -> None:
        if not decay_ramp >= 0 or not 0 <= decay_max < 1:
            raise ValueError(
                f"old policy: decay_ramp must be >= 0 and decay_max in [0, 1), got {decay_ramp}, {decay_max}"
            )
        self.decay_ramp, self.decay_max = float(decay_ramp), float(decay_max)
        self.average: list[torch.Tensor] | None = None
        self.step: int | None = None

    def decay(self, step: int) -> float:
        """``decay_n = min(decay_ramp * n, decay_max)`` of optimizer step ``n``."""
        return min(self.decay_ramp * step, self.decay_max)

    @torch.no_grad()
    def advance(self, container: torch.nn.Module, step: int) -> float:
        """Bring the average to optimizer step ``step`` (once per step; later calls of the step do nothing);
        the decay it applied (0 at the first step seen: the average starts as the weights)."""
        if self.step == step:
            return 0.0 if self.average is None else self.decay(step)
        if self.step is not None and step < self.step:
            raise ValueError(f"old policy: step {step} comes after step {self.step}")
        shards = _trainable_shards(container)
        if self.average is None:
            self.average = [s.detach().to(torch.float32, copy=True) for s in shards]
            self.step = step
            return 0.0
        _check_shapes(self.average, shards)
        decay = self.decay(step)
        torch._foreach_lerp_(self.average, [s.to(torch.float32) for s in shards], 1.0 - decay)
        self.step = step
        return decay

    @contextlib.contextmanager
    def swapped_in(self, container: torch.nn.Module) -> Iterator[None]:
        """Inside (no gradients), the container's trainable parameters hold the old policy."""
        if self.average is None:
            raise RuntimeError("old policy: swapped_in before advance (no average yet)")
        with torch.no_grad():
            shards = _trainable_shards(container)
            _check_shapes(self.average, shards)
            current = [s.detach().clone() for s in shards]
            for shard, old in zip(shards, self.average, strict=True):
                shard.copy_(old)
            _reshard(container)
            try:
                yield
            finally:
                _reshard(container)
                for shard, value in zip(shards, current, strict=True):
                    shard.copy_(value)
                _reshard(container)

    def state_dict(self) -> dict[str, Any]:
        """The average (this rank's shards) and the step it was brought to."""
        return {"step": self.step, "average": self.average}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.average = state["step"], state["average"]


def _trainable_shards(container: torch.nn.Module) -> list[torch.Tensor]:
    """This rank's shard of every trainable parameter (a DTensor's local tensor, written in place), after
    resharding every FSDP module (module docstring)."""
    _reshard(container)
    params = [p for p in container.parameters() if p.requires_grad]
    if not params:
        raise ValueError("DiffusionNFT's old policy: the container has no trainable parameter (the policy)")
    return [p.to_local() if isinstance(p, DTensor) else p for p in params]


def _reshard(container: torch.nn.Module) -> None:
    for module in container.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def _check_shapes(average: list[torch.Tensor], shards: list[torch.Tensor]) -> None:
    if [a.shape for a in average] != [s.shape for s in shards]:
        raise ValueError("DiffusionNFT's old policy: the trainable parameters changed since it was taken")


__all__ = ["OldPolicyEMA"]
