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

Checkpoints hold it per data-parallel rank (the trainer's ``pipeline`` entry: :meth:`state_dict`);
a resume at another data-parallel size reassembles each average from the saved ranks' shards and cuts this
rank's by the parameter's placements (:meth:`load_rank_states`). A run that finds none (a checkpoint of
another mode, ``training.load``) starts it as the weights of its first step, with a warning.

Under FSDP2 a parameter's registered tensor is its sharded DTensor only while resharded; before reading
or writing the shards, every FSDP module of the container is resharded (``FSDPModule.reshard``: a module
kept unsharded after a forward, as FSDP2 keeps the root, would otherwise run on the values gathered
before the swap), and again after writing, so that the next forward gathers the swapped values.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, distribute_tensor

logger = logging.getLogger(__name__)


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
        self.rows: list[int] | None = None  # each parameter's global first dimension
        self._full: list[torch.Tensor] | None = None  # reassembled at another layout, cut on first use

    def decay(self, step: int) -> float:
        """``decay_n = min(decay_ramp * n, decay_max)`` of optimizer step ``n``."""
        return min(self.decay_ramp * step, self.decay_max)

    @torch.no_grad()
    def advance(self, container: torch.nn.Module, step: int) -> float:
        """Bring the average to optimizer step ``step`` (once per step; later calls of the step do nothing);
        the decay it applied (0 at the first step seen: the average starts as the weights)."""
        params, shards = _trainable(container)
        self._place(params, shards)
        if self.step == step:
            return 0.0 if self.average is None else self.decay(step)
        if self.step is not None and step < self.step:
            raise ValueError(f"old policy: step {step} comes after step {self.step}")
        if self.average is None:
            self.average = [s.detach().to(torch.float32, copy=True) for s in shards]
            self.rows = [p.shape[0] if p.dim() else 0 for p in params]
            self.step = step
            if step > 0 and self.decay(step) > 0:
                logger.warning(
                    "DiffusionNFT: the old policy starts as the weights of step %d (none was resumed: a run "
                    "resumed without it differs from the uninterrupted run until the EMA forgets it)",
                    step,
                )
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
            shards = _trainable(container)[1]
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

    # ------------------------------------------------------------------ checkpoints (per data-parallel rank)
    def state_dict(self) -> dict[str, Any]:
        """This rank's part: the step, its shard of each average (CPU) and each parameter's global first
        dimension (``rows``: to reassemble the averages at another layout)."""
        average = None if self.average is None else [a.detach().cpu().clone() for a in self.average]
        return {"step": self.step, "average": average, "rows": self.rows}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """This rank's part, saved at the same data-parallel layout (moved to the shards' device on use)."""
        self.step, self.average, self.rows, self._full = state["step"], state["average"], state["rows"], None

    def load_rank_states(self, states: Sequence[Mapping[str, Any]], *, dp_rank: int, dp_size: int) -> None:
        """Every saved rank's part, saved at another data-parallel size: each average reassembled from the
        ranks' first-dimension shards (FSDP2's ``Shard(0)`` over the data-parallel ranks), and this rank's
        shard taken on first use with the parameter's own placements.

        Raises:
            ValueError: shards that do not make up the parameter's first dimension (another sharding).
        """
        first = states[0]
        if first["average"] is None:
            self.step, self.average, self.rows, self._full = first["step"], None, None, None
            return
        full = []
        for i, rows in enumerate(first["rows"]):
            parts = [state["average"][i] for state in states]
            if parts[0].dim() == 0:
                full.append(parts[0])
            elif sum(part.shape[0] for part in parts) == rows:
                full.append(torch.cat(parts))
            else:
                raise ValueError(
                    f"DiffusionNFT's old policy: parameter {i}'s saved shards have {[p.shape[0] for p in parts]} "
                    f"rows, not its {rows} (not sharded over the data-parallel ranks' first dimension): resume at "
                    f"the saved data-parallel size {len(states)}"
                )
        self.step, self.average, self.rows, self._full = first["step"], None, list(first["rows"]), full

    def _place(self, params: list[torch.Tensor], shards: list[torch.Tensor]) -> None:
        """Resumed averages onto the shards' device; reassembled ones (:meth:`load_rank_states`) cut to this
        rank's shards by the parameters' own placements (no communication)."""
        if self._full is not None:
            self.average = [_local_part(full, p) for full, p in zip(self._full, params, strict=True)]
            self._full = None
        if self.average is not None:
            self.average = [a.to(s.device, torch.float32) for a, s in zip(self.average, shards, strict=True)]


def _trainable(container: torch.nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every trainable parameter and this rank's shard of it (a DTensor's local tensor, written in place),
    after resharding every FSDP module (module docstring)."""
    _reshard(container)
    params = [p for p in container.parameters() if p.requires_grad]
    if not params:
        raise ValueError("DiffusionNFT's old policy: the container has no trainable parameter (the policy)")
    return params, [p.to_local() if isinstance(p, DTensor) else p for p in params]


def _local_part(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``full`` as ``param`` is placed (the whole of it for a plain tensor)."""
    full = full.to(torch.float32)
    if not isinstance(param, DTensor):
        return full
    full = full.to(param.device)
    return distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()


def _reshard(container: torch.nn.Module) -> None:
    for module in container.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def _check_shapes(average: list[torch.Tensor], shards: list[torch.Tensor]) -> None:
    if [a.shape for a in average] != [s.shape for s in shards]:
        raise ValueError("DiffusionNFT's old policy: the trainable parameters changed since it was taken")


__all__ = ["OldPolicyEMA"]
