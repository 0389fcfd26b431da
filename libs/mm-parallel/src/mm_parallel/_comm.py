"""Collective helpers for context parallelism: group size/rank with ``None`` = no parallelism,
an autograd-aware all-to-all, and ring send/receive.

Convention used throughout the context-parallel modules: ``group=None`` means "no context
parallelism" (size 1), NOT the default world group, so a model can always call the CP functions.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed import ProcessGroup

COMPILE_BREAK = (
    "context parallelism is a deliberate torch.compile graph break: its collectives run on "
    "ProcessGroup objects inside custom autograd functions (ring: isend/irecv), which dynamo "
    "does not trace; the attention kernels inside gain nothing from a compiler"
)
"""Why the public split / gather / attention functions are ``torch.compiler.disable``-d: a block
compiled around them (``features.compile``) is compiled up to the call, runs it eagerly, and resumes."""


def group_size(group: ProcessGroup | None) -> int:
    """Number of ranks in ``group``; 1 for ``None``."""
    return 1 if group is None else dist.get_world_size(group)


def group_rank(group: ProcessGroup | None) -> int:
    """This process's rank inside ``group``; 0 for ``None``."""
    return 0 if group is None else dist.get_rank(group)


def all_gather_list(x: Tensor, group: ProcessGroup) -> list[Tensor]:
    """All-gather ``x`` (no autograd); bool tensors travel as uint8 (gloo lacks bool)."""
    send = x.to(torch.uint8) if x.dtype == torch.bool else x.contiguous()
    parts = [torch.empty_like(send) for _ in range(group_size(group))]
    dist.all_gather(parts, send, group=group)
    return [p.to(torch.bool) for p in parts] if x.dtype == torch.bool else parts


def _all_to_all(x: Tensor, scatter_dim: int, gather_dim: int, group: ProcessGroup) -> Tensor:
    """Split ``x`` into P chunks along ``scatter_dim``, send chunk j to rank j, concatenate the
    received chunks (ordered by source rank) along ``gather_dim``."""
    world = group_size(group)
    send = torch.stack(x.chunk(world, dim=scatter_dim), dim=0).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return torch.cat(recv.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, scatter_dim: int, gather_dim: int, group: ProcessGroup) -> Tensor:  # noqa: ANN001
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:  # noqa: ANN001
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad, gather_dim, scatter_dim, ctx.group), None, None, None


def all_to_all(x: Tensor, scatter_dim: int, gather_dim: int, group: ProcessGroup | None) -> Tensor:
    """Autograd-aware all-to-all (its backward is the transposed all-to-all); identity for size 1."""
    if group_size(group) == 1:
        return x
    size = x.size(scatter_dim)
    world = group_size(group)
    if size % world:
        raise ValueError(
            f"all_to_all: dim {scatter_dim} has size {size}, not divisible by group size {world}"
        )
    return _AllToAll.apply(x, scatter_dim, gather_dim, group)


def ring_exchange(tensors: tuple[Tensor, ...], group: ProcessGroup) -> tuple[tuple[Tensor, ...], list]:
    """Start sending ``tensors`` to the next rank of the ring and receiving as many from the previous one.

    The tensors must be contiguous and stay alive until the requests complete. Returns the receive
    buffers and the requests to ``wait()`` on before reading them.
    """
    if not all(t.is_contiguous() for t in tensors):
        raise ValueError("ring_exchange: the tensors to send must be contiguous")
    world, rank = group_size(group), group_rank(group)
    nxt, prev = (
        dist.get_global_rank(group, (rank + 1) % world),
        dist.get_global_rank(group, (rank - 1) % world),
    )
    recv = tuple(torch.empty_like(t) for t in tensors)
    ops = [dist.P2POp(dist.isend, t, nxt, group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, t, prev, group) for t in recv]
    return recv, dist.batch_isend_irecv(ops)
