"""The tensors of a module that a checkpoint fills: persistent state, tied aliases, meta materialization,
and the local slice of an FSDP2 DTensor parameter."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset


@dataclass(frozen=True)
class Target:
    """One checkpointable tensor of a module and every state-dict name that refers to it (tied weights)."""

    key: str
    tensor: torch.Tensor
    aliases: tuple[str, ...]


def checkpoint_targets(model: nn.Module) -> dict[str, Target]:
    """Persistent parameters and buffers by state-dict key (non-persistent buffers excluded).

    Keys sharing one tensor (tied weights) share one :class:`Target` listing all of them.
    """
    state = {k: v for k, v in model.state_dict(keep_vars=True).items() if isinstance(v, torch.Tensor)}
    names_by_id: dict[int, list[str]] = {}
    for key, tensor in state.items():
        names_by_id.setdefault(id(tensor), []).append(key)
    return {key: Target(key, tensor, tuple(names_by_id[id(tensor)])) for key, tensor in state.items()}


def _is_meta(t: torch.Tensor) -> bool:
    return t.is_meta or (isinstance(t, DTensor) and t.to_local().is_meta)


def infer_device(model: nn.Module) -> torch.device:
    """Device to materialize on: that of a real tensor, else a DTensor mesh's device, else CPU."""
    tensors = list(model.parameters()) + list(model.buffers())
    for t in tensors:
        if not _is_meta(t):
            return t.device
    for t in tensors:
        if isinstance(t, DTensor):
            device_type = t.device_mesh.device_type
            if device_type == "cpu":
                return torch.device("cpu")
            module = getattr(torch, device_type)
            return torch.device(device_type, module.current_device())
    return torch.device("cpu")


def materialize_meta(model: nn.Module, device: torch.device | str | None = None) -> list[str]:
    """Allocate (uninitialized) storage for meta parameters/buffers with ``to_empty``; keeps tied weights tied.

    Returns the names of non-persistent buffers that were meta: no checkpoint holds them, so they are
    left uninitialized and reported to the caller.
    """
    if not any(_is_meta(t) for t in list(model.parameters()) + list(model.buffers())):
        return []
    persistent = set(model.state_dict(keep_vars=True))
    lost = [name for name, b in model.named_buffers() if _is_meta(b) and name not in persistent]
    ties = _tied_parameter_slots(model)
    model.to_empty(device=device if device is not None else infer_device(model))
    for slots in ties:  # to_empty gives each slot its own new Parameter: restore the ties
        owner, name = slots[0]
        shared = owner._parameters[name]
        for module, attr in slots[1:]:
            module._parameters[attr] = shared
    return lost


def _tied_parameter_slots(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """(module, attribute) slots of every parameter object registered more than once."""
    slots: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                slots.setdefault(id(param), []).append((module, name))
    return [s for s in slots.values() if len(s) > 1]


def local_index(target: torch.Tensor) -> tuple[slice, ...] | None:
    """Index of the global tensor that this rank holds for a DTensor, None for a plain tensor."""
    if not isinstance(target, DTensor):
        return None
    shape, offset = compute_local_shape_and_global_offset(target.shape, target.device_mesh, target.placements)
    return tuple(slice(o, o + n) for o, n in zip(offset, shape))


def local_view(target: torch.Tensor) -> torch.Tensor:
    """The storage this rank owns: the local shard of a DTensor, else the tensor itself."""
    return target.to_local() if isinstance(target, DTensor) else target


@torch.no_grad()
def assign_local(target: torch.Tensor, value: torch.Tensor) -> None:
    """Copy ``value`` (already this rank's slice) into ``target``'s local storage, casting dtype/device."""
    local = local_view(target)
    if tuple(local.shape) != tuple(value.shape):
        raise ValueError(f"local shard shape {tuple(local.shape)} != slice shape {tuple(value.shape)}")
    local.copy_(value)
