"""Collective helpers for context parallelism: group size/rank with ``None`` = no parallelism,
an autograd-aware all-to-all, and ring send/receive.

The all-to-all is torch's functional collective ``all_to_all_single_autograd``
(``torch.distributed._functional_collectives``): dynamo traces it, so a compiled block that calls
Ulysses attention has no graph break (a hand-written autograd Function around
``dist.all_to_all_single`` was one); its backward is the transposed all-to-all. In eager mode it
returns at once and waits at the first use of its result (an ``AsyncCollectiveTensor``), which is
what :func:`start_all_to_all` / :func:`finish_all_to_all` use to overlap several all-to-alls with
compute.

Convention used throughout the context-parallel modules: ``group=None`` means "no context
parallelism" (size 1), NOT the default world group, so a model can always call the CP functions.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import Tensor
from torch.distributed import ProcessGroup

COMPILE_BREAK = (
    "ring attention and the sequence split / gather are a deliberate torch.compile graph break: the ring "
    "exchanges KV blocks point to point (dist.batch_isend_irecv) inside a custom autograd function driven "
    "by host-side block plans, and the split / gather run all-gathers inside custom autograd functions; the "
    "attention kernels inside gain nothing from a compiler"
)
"""Why ``ring_attention`` (and USP with a ring) and the split / gather functions are
``torch.compiler.disable``-d: a block compiled around them (``features.compile``) is compiled up to the
call, runs it eagerly, and resumes. Ulysses attention (and USP without a ring) is traced whole.

torch 2.13's functional point-to-point op (``_functional_collectives.batch_p2p_ops_inplace``) could carry
the ring's exchange: swapped in for :func:`ring_exchange`, with the kernel chosen before tracing, dynamo
traced a Ring 2 block with no graph break and ``fullgraph=True`` gave the eager result, but every send's
work was left unwaited (32 per block call), and the planner's point-to-point accounting
(``mm_trainer.planner``), the CUDA fake-tensor test and kernel resolution inside traced code (a
``find_spec`` of flash_attn is an import-failure break) would have to follow. Not done here."""


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


def start_all_to_all(x: Tensor, scatter_dim: int, group: ProcessGroup) -> Tensor:
    """Start the all-to-all of :func:`all_to_all`: ``[P, ...]`` chunk ``j`` of ``x`` along ``scatter_dim``
    goes to rank ``j``; returns the received chunks stacked by source rank (waited for at first use)."""
    send = torch.stack(x.chunk(group_size(group), dim=scatter_dim), dim=0).contiguous()
    return funcol.all_to_all_single_autograd(send, None, None, group)


def finish_all_to_all(received: Tensor, gather_dim: int) -> Tensor:
    """Concatenate :func:`start_all_to_all`'s received chunks (ordered by source rank) along ``gather_dim``
    of the chunks (waits for the collective)."""
    return torch.cat(received.unbind(0), dim=gather_dim)


def check_all_to_all(x: Tensor, scatter_dim: int, group: ProcessGroup | None) -> None:
    """Raise unless ``scatter_dim`` of ``x`` splits over the group."""
    size, world = x.size(scatter_dim), group_size(group)
    if size % world:
        raise ValueError(
            f"all_to_all: dim {scatter_dim} has size {size}, not divisible by group size {world}"
        )


def all_to_all(x: Tensor, scatter_dim: int, gather_dim: int, group: ProcessGroup | None) -> Tensor:
    """Autograd-aware all-to-all (its backward is the transposed all-to-all); identity for size 1.

    Split ``x`` into P chunks along ``scatter_dim``, send chunk j to rank j, concatenate the received
    chunks (ordered by source rank) along ``gather_dim``.
    """
    if group_size(group) == 1:
        return x
    check_all_to_all(x, scatter_dim, group)
    return finish_all_to_all(start_all_to_all(x, scatter_dim, group), gather_dim)  # type: ignore[arg-type]


def all_gather_no_grad(x: Tensor, group: ProcessGroup, dim: int) -> Tensor:
    """Every rank's ``x`` concatenated along ``dim`` (no autograd; a functional collective, traced by
    dynamo); bool tensors travel as uint8 (gloo lacks bool)."""
    send = x.to(torch.uint8) if x.dtype == torch.bool else x.contiguous()
    gathered = funcol.all_gather_single(send, dim, group)
    return gathered.to(torch.bool) if x.dtype == torch.bool else gathered


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
