"""Exponential moving average (EMA) of the trainable parameters, kept on each rank's own shards.

After each optimizer step that updated the weights ``w_n``::

    ema_0 = w_0                                   # the weights the run starts from
    ema_n = decay * ema_n-1 + (1 - decay) * w_n   # = lerp(ema_n-1, w_n, 1 - decay)

Under FSDP2 a parameter is a DTensor sharded over the data-parallel mesh; its average is a DTensor of
the same mesh and placements, so each rank updates only its local shard (elementwise: no
communication), a checkpoint saves it through DCP beside the weights, and a resume at another
layout reshards it as it reshards them. The average is kept in fp32 whatever the parameters' dtype
(a bf16 average would round ``(1 - decay) * (w - ema)`` away).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import torch
from torch import nn
from torch.distributed.tensor import DTensor


class ParameterEMA:
    """The EMA of ``model``'s trainable parameters, under the model's state-dict keys.

    Build it once the weights are in place (after sharding and loading); call :meth:`update` after
    every optimizer step that changed them. ``state_dict()`` / ``load_state_dict()`` hold one tensor
    per key (DTensors for sharded parameters), the form ``DistributedCheckpointer`` saves as ``ema``.
    """

    def __init__(self, model: nn.Module, *, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        self.decay = decay
        self._keys, self._params = _trainable_by_key(model)
        with torch.no_grad():
            self._average = [p.detach().to(torch.float32, copy=True) for p in self._params]

    @torch.no_grad()
    def update(self) -> None:
        """``ema <- decay * ema + (1 - decay) * w`` on every local shard."""
        averages = [_local(a) for a in self._average]
        weights = [_local(p).to(torch.float32) for p in self._params]
        torch._foreach_lerp_(averages, weights, 1.0 - self.decay)

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The averages in the parameters (cast to their dtype) inside the block, the trained weights put
        back after it, also when the block raises; costs one copy of the trainable parameters' shards."""
        with torch.no_grad():
            trained = [_local(p).clone() for p in self._params]
            for p, a in zip(self._params, self._average):
                _local(p).copy_(_local(a))
        try:
            yield
        finally:
            with torch.no_grad():
                for p, w in zip(self._params, trained):
                    _local(p).copy_(w)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """``{state-dict key: average}`` (tied parameters: every key of one parameter, one tensor)."""
        return {key: self._average[i] for key, i in self._keys.items()}

    @torch.no_grad()
    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Copy ``state`` (the same keys, tensors of the averages' shapes) into the averages."""
        missing = sorted(set(self._keys) - set(state))
        unexpected = sorted(set(state) - set(self._keys))
        if missing or unexpected:
            raise KeyError(f"EMA state: missing keys {missing[:5]}, unexpected keys {unexpected[:5]}")
        for key, i in self._keys.items():
            if state[key] is not self._average[i]:
                self._average[i].copy_(state[key])


def _trainable_by_key(model: nn.Module) -> tuple[dict[str, int], list[nn.Parameter]]:
    """Each trainable parameter once, and its index under every state-dict key that holds it.

    Keys come from ``model.state_dict(keep_vars=True)``: the names checkpoints and exports use (a
    container's sub-model prefixes, wrappers' prefixes removed by their own state-dict hooks).
    """
    trainable = {id(p): p for p in model.parameters() if p.requires_grad}
    index: dict[int, int] = {}
    params: list[nn.Parameter] = []
    keys: dict[str, int] = {}
    for key, value in model.state_dict(keep_vars=True).items():
        if id(value) in trainable:
            if id(value) not in index:
                index[id(value)] = len(params)
                params.append(trainable[id(value)])
            keys[key] = index[id(value)]
    absent = [name for name, p in model.named_parameters() if p.requires_grad and id(p) not in index]
    if absent:
        raise ValueError(
            f"training.ema: trainable parameters {absent[:5]} are not in the model's state dict (what a "
            "checkpoint holds), so their average could be neither saved nor exported"
        )
    if not params:
        raise ValueError("training.ema: the model has no trainable parameter to average")
    return keys, params


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (the tensor itself, written in place), a plain tensor as is."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
