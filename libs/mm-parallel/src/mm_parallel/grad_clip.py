"""Gradient-norm clipping for parameters that live on different meshes.

A sharded gradient's norm needs a reduction over the mesh dimensions it is
*sharded* on, and only those: reducing over an HSDP replicate dimension (or over a
replicated parameter) would count the same values several times. Parameters are
grouped by (mesh, shard dims); each group is reduced in its own groups.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

logger = logging.getLogger(__name__)

_GroupKey = tuple[DeviceMesh | None, tuple[int, ...]]


def _group_grads(grads: list[torch.Tensor]) -> dict[_GroupKey, list[torch.Tensor]]:
    groups: dict[_GroupKey, list[torch.Tensor]] = defaultdict(list)
    for grad in grads:
        if isinstance(grad, DTensor):
            shard_dims = tuple(i for i, p in enumerate(grad.placements) if p.is_shard())
            groups[(grad.device_mesh, shard_dims)].append(grad.to_local())
        else:
            groups[(None, ())].append(grad)
    return groups


def _local_norm_term(tensors: list[torch.Tensor], norm_type: float) -> torch.Tensor:
    """sum(|g|^p) over local tensors (max(|g|) for the inf-norm), in fp32."""
    tensors = [t for t in tensors if t.numel()]
    if not tensors:  # an uneven shard can leave a rank with no elements
        return torch.zeros(())
    norms = torch.stack([torch.linalg.vector_norm(t.float(), norm_type) for t in tensors])
    return norms.max() if math.isinf(norm_type) else norms.pow(norm_type).sum()


def _reduce(
    term: torch.Tensor, mesh: DeviceMesh, shard_dims: tuple[int, ...], norm_type: float
) -> torch.Tensor:
    op = dist.ReduceOp.MAX if math.isinf(norm_type) else dist.ReduceOp.SUM
    comm = term.to(mesh.device_type) if term.device.type != mesh.device_type else term
    for dim in shard_dims:
        dist.all_reduce(comm, op=op, group=mesh.get_group(dim))
    return comm.to(term.device)


def total_grad_norm(params: Iterable[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """The global ``norm_type``-norm of all gradients, identical on every rank."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    terms = []
    for (mesh, shard_dims), tensors in _group_grads(grads).items():
        term = _local_norm_term(tensors, norm_type)
        terms.append(term if mesh is None else _reduce(term, mesh, shard_dims, norm_type))
    device = terms[0].device
    stacked = torch.stack([t.to(device) for t in terms])
    if math.isinf(norm_type):
        return stacked.max()
    return stacked.sum().pow(1.0 / norm_type)


def clip_grad_norm_(
    params: Iterable[torch.Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    *,
    error_if_nonfinite: bool = False,
) -> torch.Tensor:
    """Clip gradients in place to ``max_norm`` and return the total norm before clipping.

    Correct for any mix of 1-D FSDP, HSDP (2-D) and plain (replicated) parameters.
    ``max_norm <= 0`` only computes the norm. A non-finite norm is logged (or raised
    with ``error_if_nonfinite``) and gradients are left untouched: the caller decides
    whether to skip the step.
    """
    params = [p for p in params if p.grad is not None]
    total = total_grad_norm(params, norm_type)
    if not torch.isfinite(total):
        message = f"gradient norm is {total.item()}; gradients were not clipped"
        if error_if_nonfinite:
            raise RuntimeError(message)
        logger.warning(message)
        return total
    if max_norm <= 0:
        return total
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for p in params:
        grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
        grad.mul_(coef.to(grad.device, grad.dtype))
    return total
