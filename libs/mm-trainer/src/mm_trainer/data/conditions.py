"""``features.condition_micro_steps``: conditions encoded for several micro-steps ahead, consumed one by one.

The ranks of a context-parallel group see the same micro-batches. With ``condition_micro_steps = N`` every
rank draws the next N micro-batches; micro-batch i is encoded only by the group's rank ``i % cp``,
which then broadcasts its conditions to the others. The frozen VAE / text encoders thus run once
per micro-batch instead of once per rank. All ranks first encode their own micro-batches (the same
number each, so collectives of a sharded encoder stay in step) and only then exchange.

The saved data position is the loader's after the last micro-batch actually trained on, exactly
what the plain stream saves: a resume (at any ``condition_micro_steps``) re-reads the rest of the group.
Conditions are a deterministic function of the batch (frozen encoders in eval, VAE mode), so
nothing else needs saving.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from mm_parallel import broadcast_tensor_dict
from torch.distributed import ProcessGroup

from mm_trainer.data.batches import BatchStream, to_device

EncodeFn = Callable[[Mapping[str, Any]], dict[str, Any]]


class ConditionStream:
    """Micro-batches as ``{"conditions": ...}`` for ``container(conditions=...)``, encoded N at a time."""

    def __init__(
        self,
        batches: BatchStream,
        encode: EncodeFn,
        *,
        micro_steps: int,
        device: torch.device,
        cp_group: ProcessGroup | None = None,
    ) -> None:
        """
        Args:
            batches: the rank's raw micro-batch stream.
            encode: one micro-batch (on ``device``) -> its conditions (``container.encode_conditions``).
            micro_steps: N, a multiple of the context-parallel group size.
            device: the training device.
            cp_group: the context-parallel group (None: no context parallelism).
        """
        self.cp_size = dist.get_world_size(cp_group) if cp_group is not None else 1
        if micro_steps < 1 or micro_steps % self.cp_size:
            raise ValueError(
                f"features.condition_micro_steps={micro_steps} must be a positive multiple of the context-parallel "
                f"size {self.cp_size}"
            )
        self.batches, self.encode, self.micro_steps = batches, encode, micro_steps
        self.device, self.cp_group = device, cp_group
        self.cp_rank = dist.get_rank(cp_group) if cp_group is not None else 0
        self._slots: list[dict[str, Any]] = []
        self._states: list[dict[str, Any]] = []  # loader state after each slot's micro-batch
        self._sample_ids: list[torch.Tensor | None] = []
        self._next = 0
        self._state = batches.state_dict()

    def describe_samples(self, sample_ids: Any) -> str:
        """The raw stream's words for these samples (:meth:`BatchStream.describe_samples`)."""
        return self.batches.describe_samples(sample_ids)

    def next_batch(self) -> dict[str, Any]:
        """The next micro-step's ``{"conditions": ..., "sample_ids": ...}``; encodes the next N
        micro-batches when needed (``sample_ids`` only when the raw batches carry them)."""
        if self._next == len(self._slots):
            self._fill()
        conditions, self._state = self._slots[self._next], self._states[self._next]
        self._slots[self._next] = {}  # release it: the engine holds it now
        ids = self._sample_ids[self._next]
        self._next += 1
        return {"conditions": conditions} if ids is None else {"conditions": conditions, "sample_ids": ids}

    def _fill(self) -> None:
        raw, states = [], []
        for _ in range(self.micro_steps):
            raw.append(self.batches.next_batch())
            states.append(self.batches.state_dict())
        # every rank of the CP group drew the same micro-batches: its own copy of their sample ids
        self._sample_ids = [batch.pop("sample_ids", None) for batch in raw]
        own = {i: self._encode(raw[i]) for i in range(self.micro_steps) if i % self.cp_size == self.cp_rank}
        self._slots = [
            broadcast_tensor_dict(own.get(i), src=i % self.cp_size, group=self.cp_group, device=self.device)
            for i in range(self.micro_steps)
        ]
        self._states, self._next = states, 0

    def _encode(self, batch: Any) -> dict[str, Any]:
        conditions = self.encode(to_device(batch, self.device))
        grads = [k for k, v in conditions.items() if isinstance(v, torch.Tensor) and v.requires_grad]
        if grads:
            raise ValueError(
                f"features.condition_micro_steps={self.micro_steps}: conditions {grads} require grad (a trainable "
                "condition encoder?); conditions encoded ahead or on another rank carry no autograd graph. "
                "Freeze the encoders or set features.condition_micro_steps: 1"
            )
        return conditions

    @property
    def bad_this_epoch(self) -> int:
        """The wrapped stream's count (it may run up to N - 1 micro-batches ahead)."""
        return self.batches.bad_this_epoch

    @property
    def bad_limit(self) -> float | None:
        return self.batches.bad_limit

    def state_dict(self) -> dict[str, Any]:
        """The loader position after the last micro-batch handed out (same format as ``BatchStream``)."""
        return dict(self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the loader there; encoded conditions not yet used are dropped and re-encoded."""
        self.batches.load_state_dict(state)
        self._restart()

    def load_rank_states(self, states: Sequence[dict[str, Any]], *, dp_rank: int, dp_size: int) -> None:
        """Resume from the states of a run at another data-parallel size (``BatchStream.load_rank_states``)."""
        self.batches.load_rank_states(states, dp_rank=dp_rank, dp_size=dp_size)
        self._restart()

    def _restart(self) -> None:
        self._slots, self._states, self._sample_ids, self._next = [], [], [], 0
        self._state = self.batches.state_dict()
