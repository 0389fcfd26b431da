"""Split a sequence across a context-parallel group and gather it back, autograd-aware.

Layouts (``P`` = group size):

- ``contiguous``: the sequence is cut into ``P`` equal chunks; rank ``r`` holds chunk ``r``.
- ``zigzag``: the sequence is cut into ``2P`` equal chunks; rank ``r`` holds chunks ``r`` and
  ``2P-1-r`` (in that order), so causal attention work is the same on every rank. With P = 2
  and chunks 0..3: rank 0 holds [0, 3], rank 1 holds [1, 2]; gathering restores 0, 1, 2, 3.

Uneven lengths: the length must be a multiple of ``P`` (contiguous) or ``2P`` (zigzag);
otherwise ``split_sequence(..., pad=True)`` zero-pads the END of the sequence up to
``padded_length(seq_len, P, layout)`` and ``gather_sequence(..., seq_len=L)`` drops the padding
again. Mask the padded keys in attention with a key padding mask split the same way, e.g.
``split_sequence(torch.ones(B, L, dtype=torch.bool), 1, group, layout, pad=True)`` (pads False).

Gradients (``grad_mode``):

- ``"adjoint"`` (default): the exact adjoints. Split's backward keeps this rank's slice of the
  gradient (zeros elsewhere, no communication); gather's backward sums the gradient over the
  group (all-reduce) and keeps this rank's slice. The per-rank parameter gradients then add up to
  the gradient of the sum of the ranks' losses, so averaging gradients over the CP ranks (what
  FSDP does when CP ranks are in its shard group) gives the exact gradient whether every rank
  computes the same loss on gathered outputs or each rank a mean over its own tokens.
- ``"replicated"`` (Megatron's gather-forward-split-backward convention): split's backward
  all-gathers the gradient, gather's backward takes this rank's slice. Tensors before the split
  and after the gather are treated as one replicated value; parameters used between them then need
  their gradients SUMMED over the CP group, parameters outside need none.

USP (Ulysses x Ring) mapping: ``split_for_usp`` splits the sequence over the ring group first
(ring rank ``r`` gets its ``layout`` share, the "ring-local" sequence), then cuts the ring-local
sequence into ``U`` contiguous pieces over the ulysses group. ``gather_for_usp`` is the exact
reverse: ulysses gather first (rebuilding the ring-local sequence, which is also what the
Ulysses all-to-all inside ``usp_attention`` produces), then the layout-aware ring gather. For the
``contiguous`` layout this equals ``split_sequence`` over a ring-major combined CP group
(cp rank = ring_rank * U + ulysses_rank, e.g. ``init_device_mesh(.., ("ring", "ulysses"))``);
for ``zigzag`` it does not, so use these helpers.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor
from torch.distributed import ProcessGroup

from mm_parallel._comm import COMPILE_BREAK, all_gather_list, group_rank, group_size

Layout = Literal["contiguous", "zigzag"]
GradMode = Literal["adjoint", "replicated"]
LAYOUTS = ("contiguous", "zigzag")


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def num_chunks(world_size: int, layout: Layout) -> int:
    """How many equal chunks the sequence is cut into for ``world_size`` ranks."""
    _check_layout(layout)
    return 2 * world_size if layout == "zigzag" else world_size


def rank_chunk_ids(rank: int, world_size: int, layout: Layout) -> list[int]:
    """Chunk indices held by ``rank``, in local order (zigzag: ``[rank, 2P-1-rank]``)."""
    _check_layout(layout)
    return [rank, 2 * world_size - 1 - rank] if layout == "zigzag" else [rank]


def padded_length(seq_len: int, world_size: int, layout: Layout = "contiguous") -> int:
    """Smallest length >= ``seq_len`` that ``layout`` can split over ``world_size`` ranks."""
    if world_size == 1:
        return seq_len
    n = num_chunks(world_size, layout)
    return -(-seq_len // n) * n


def local_token_indices(
    seq_len: int,
    rank: int,
    world_size: int,
    layout: Layout = "contiguous",
    device: torch.device | None = None,
) -> Tensor:
    """Global positions of the tokens ``rank`` holds (e.g. to slice RoPE tables); ``seq_len`` padded."""
    if world_size == 1:
        return torch.arange(seq_len, device=device)
    n = num_chunks(world_size, layout)
    if seq_len % n:
        raise ValueError(f"seq_len {seq_len} is not divisible by {n} ({layout} over {world_size} ranks)")
    size = seq_len // n
    return torch.cat(
        [
            torch.arange(c * size, (c + 1) * size, device=device)
            for c in rank_chunk_ids(rank, world_size, layout)
        ]
    )


def real_token_counts(
    seq_len: int, local_len: int, world_size: int, layout: Layout = "contiguous"
) -> list[int]:
    """Per rank: how many of its ``local_len`` tokens are real when ``seq_len`` real tokens were split
    with ``pad=True`` (padding at the end). A rank's positions increase with its local index in both
    layouts, so its real tokens are always its first ``count`` ones. Host arithmetic, no tensors."""
    padded = local_len * world_size
    if not 0 <= seq_len <= padded:
        raise ValueError(
            f"{seq_len} real tokens do not fit a padded sequence of {world_size} x {local_len} = {padded}"
        )
    if world_size == 1:
        return [seq_len]
    size = padded // num_chunks(world_size, layout)
    return [
        sum(min(size, max(0, seq_len - c * size)) for c in rank_chunk_ids(rank, world_size, layout))
        for rank in range(world_size)
    ]


def _take_local(x: Tensor, dim: int, rank: int, world: int, layout: Layout) -> Tensor:
    chunks = x.chunk(num_chunks(world, layout), dim=dim)
    return torch.cat([chunks[c] for c in rank_chunk_ids(rank, world, layout)], dim=dim).contiguous()


def _assemble(parts: list[Tensor], dim: int, layout: Layout) -> Tensor:
    world = len(parts)
    slots: list[Tensor | None] = [None] * num_chunks(world, layout)
    for rank, part in enumerate(parts):
        ids = rank_chunk_ids(rank, world, layout)
        for c, piece in zip(ids, part.chunk(len(ids), dim=dim), strict=True):
            slots[c] = piece
    return torch.cat(slots, dim=dim)  # type: ignore[arg-type]


def _zero_pad_local(grad: Tensor, dim: int, rank: int, world: int, layout: Layout) -> Tensor:
    ids = rank_chunk_ids(rank, world, layout)
    pieces = grad.chunk(len(ids), dim=dim)
    slots = [torch.zeros_like(pieces[0])] * num_chunks(world, layout)
    for c, piece in zip(ids, pieces, strict=True):
        slots[c] = piece
    return torch.cat(slots, dim=dim)


class _Split(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, dim: int, group: ProcessGroup, layout: Layout, grad_mode: GradMode) -> Tensor:  # noqa: ANN001
        ctx.args = (dim, group, layout, grad_mode)
        return _take_local(x, dim, group_rank(group), group_size(group), layout)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # noqa: ANN001
        dim, group, layout, grad_mode = ctx.args
        if grad_mode == "replicated":
            full = _assemble(all_gather_list(grad, group), dim, layout)
        else:
            full = _zero_pad_local(grad, dim, group_rank(group), group_size(group), layout)
        return full, None, None, None, None


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, dim: int, group: ProcessGroup, layout: Layout, grad_mode: GradMode) -> Tensor:  # noqa: ANN001
        ctx.args = (dim, group, layout, grad_mode)
        return _assemble(all_gather_list(x, group), dim, layout)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # noqa: ANN001
        dim, group, layout, grad_mode = ctx.args
        if grad_mode == "adjoint":
            grad = grad.contiguous()
            torch.distributed.all_reduce(grad, group=group)
        return _take_local(grad, dim, group_rank(group), group_size(group), layout), None, None, None, None


def _pad_to(x: Tensor, dim: int, length: int) -> Tensor:
    extra = length - x.size(dim)
    if extra == 0:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat([x, x.new_zeros(shape)], dim=dim)


def _check_grad_mode(grad_mode: str) -> None:
    if grad_mode not in ("adjoint", "replicated"):
        raise ValueError(f"grad_mode must be 'adjoint' or 'replicated', got {grad_mode!r}")


@torch.compiler.disable(reason=COMPILE_BREAK)
def split_sequence(
    x: Tensor,
    dim: int,
    group: ProcessGroup | None,
    layout: Layout = "contiguous",
    *,
    pad: bool = False,
    grad_mode: GradMode = "adjoint",
) -> Tensor:
    """Return this rank's share of ``x`` along ``dim`` (``x`` is the same full tensor on every rank).

    Raises if the length does not fit the layout unless ``pad=True`` (zero-pads the end up to
    ``padded_length``). ``group=None`` or size 1 returns ``x`` unchanged.
    """
    _check_layout(layout)
    _check_grad_mode(grad_mode)
    world = group_size(group)
    if world == 1:
        return x
    dim = dim % x.dim()
    length, target = x.size(dim), padded_length(x.size(dim), world, layout)
    if length != target:
        if not pad:
            raise ValueError(
                f"split_sequence: length {length} of dim {dim} is not divisible by {num_chunks(world, layout)} "
                f"({layout} layout over {world} ranks); pass pad=True to zero-pad it to {target}"
            )
        x = _pad_to(x, dim, target)
    return _Split.apply(x, dim, group, layout, grad_mode)


@torch.compiler.disable(reason=COMPILE_BREAK)
def gather_sequence(
    x: Tensor,
    dim: int,
    group: ProcessGroup | None,
    layout: Layout = "contiguous",
    *,
    seq_len: int | None = None,
    grad_mode: GradMode = "adjoint",
) -> Tensor:
    """Inverse of :func:`split_sequence`: the full sequence on every rank, in global order.

    ``seq_len`` (the unpadded length) drops the padding ``split_sequence(pad=True)`` added.
    """
    _check_layout(layout)
    _check_grad_mode(grad_mode)
    dim = dim % x.dim()
    if group_size(group) > 1:
        if layout == "zigzag" and x.size(dim) % 2:
            raise ValueError(
                f"gather_sequence: zigzag local length must be even, got {x.size(dim)} on dim {dim}"
            )
        x = _Gather.apply(x, dim, group, layout, grad_mode)
    return x if seq_len is None else x.narrow(dim, 0, seq_len)


def usp_padded_length(
    seq_len: int,
    ulysses_group: ProcessGroup | None,
    ring_group: ProcessGroup | None,
    layout: Layout = "zigzag",
) -> int:
    """Smallest length >= ``seq_len`` that :func:`split_for_usp` can split without padding."""
    ring = group_size(ring_group)
    multiple = (num_chunks(ring, layout) if ring > 1 else 1) * group_size(ulysses_group)
    return -(-seq_len // multiple) * multiple


@torch.compiler.disable(reason=COMPILE_BREAK)
def split_for_usp(
    x: Tensor,
    dim: int,
    ulysses_group: ProcessGroup | None,
    ring_group: ProcessGroup | None,
    layout: Layout = "zigzag",
    *,
    pad: bool = False,
    grad_mode: GradMode = "adjoint",
) -> Tensor:
    """Split for :func:`usp_attention`: ring split (``layout``) first, then contiguous over ulysses."""
    dim = dim % x.dim()
    length, target = x.size(dim), usp_padded_length(x.size(dim), ulysses_group, ring_group, layout)
    if length != target:
        if not pad:
            raise ValueError(
                f"split_for_usp: length {length} of dim {dim} does not split over ring {group_size(ring_group)} "
                f"({layout}) x ulysses {group_size(ulysses_group)}; pass pad=True to zero-pad it to {target}"
            )
        x = _pad_to(x, dim, target)
    x = split_sequence(x, dim, ring_group, layout, grad_mode=grad_mode)
    return split_sequence(x, dim, ulysses_group, "contiguous", grad_mode=grad_mode)


@torch.compiler.disable(reason=COMPILE_BREAK)
def gather_for_usp(
    x: Tensor,
    dim: int,
    ulysses_group: ProcessGroup | None,
    ring_group: ProcessGroup | None,
    layout: Layout = "zigzag",
    *,
    seq_len: int | None = None,
    grad_mode: GradMode = "adjoint",
) -> Tensor:
    """Exact reverse of :func:`split_for_usp`: ulysses gather, then the layout-aware ring gather."""
    x = gather_sequence(x, dim, ulysses_group, "contiguous", grad_mode=grad_mode)
    return gather_sequence(x, dim, ring_group, layout, seq_len=seq_len, grad_mode=grad_mode)
