"""`broadcast_tensor_dict`: send a flat dict of tensors and plain values from one rank of a group.

Shapes and dtypes are not known to the receivers, so they travel first as one pickled object;
each tensor then goes by ``dist.broadcast`` on the communication device (NCCL / HCCL need device
tensors), bool tensors as uint8 (gloo has no bool).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup


@dataclass(frozen=True)
class _TensorSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype


def broadcast_tensor_dict(
    data: dict[str, Any] | None,
    *,
    src: int,
    group: ProcessGroup | None,
    device: torch.device | str,
) -> dict[str, Any]:
    """``data`` from group rank ``src`` on every rank of ``group``.

    Args:
        data: on ``src``, a dict whose values are tensors or picklable values holding no tensor
            (ignored elsewhere: pass None).
        src: the sender's rank inside ``group``.
        group: the process group; None (no group) returns ``data`` unchanged.
        device: where received tensors are allocated and the transfer happens.

    Returns:
        The same keys; tensors on ``device`` (the sender's are moved there), no autograd graph.
    """
    if group is None or dist.get_world_size(group) == 1:
        if data is None:
            raise ValueError("broadcast_tensor_dict without a group needs the data")
        return data
    me = dist.get_rank(group)
    if me == src:
        if data is None:
            raise ValueError(f"broadcast_tensor_dict: rank {src} of the group is the sender but has no data")
        _check_values(data)
        specs: dict[str, Any] = {
            k: _TensorSpec(tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v
            for k, v in data.items()
        }
    else:
        specs = {}
    global_src = dist.get_global_rank(group, src)
    box = [specs]
    dist.broadcast_object_list(box, src=global_src, group=group, device=torch.device(device))
    out: dict[str, Any] = {}
    for key, spec in box[0].items():
        if not isinstance(spec, _TensorSpec):
            out[key] = spec
            continue
        wire = torch.uint8 if spec.dtype == torch.bool else spec.dtype
        if me == src:
            buffer = data[key].detach().to(device=device, dtype=wire).contiguous()  # type: ignore[index]
        else:
            buffer = torch.empty(spec.shape, dtype=wire, device=device)
        dist.broadcast(buffer, src=global_src, group=group)
        out[key] = buffer.to(spec.dtype) if wire != spec.dtype else buffer
    return out


def _check_values(data: dict[str, Any]) -> None:
    for key, value in data.items():
        if isinstance(value, (list, tuple, dict)) and _holds_tensor(value):
            raise TypeError(
                f"broadcast_tensor_dict: value {key!r} nests tensors in a {type(value).__name__}; "
                "expected a tensor or a plain value"
            )


def _holds_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(_holds_tensor(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(v) for v in value)
    return False
