"""Split a packed sequence over Ring x Ulysses and gather it back (:class:`mm_parallel.PackedLayout`).

``split_packed`` picks this rank's tokens out of the full packed tensor by index (padding comes from
one appended zero token): no communication, and its gradient is the exact adjoint (this rank's
tokens' gradients scattered back, zeros elsewhere), as :func:`mm_parallel.split_sequence`'s default.
``gather_packed`` gathers every rank's shard (Ulysses, then Ring, in CP order: the contiguous gather
of :func:`mm_parallel.gather_for_usp`, whose backward all-reduces) and puts every real token back at
its original position; the padding is dropped. The two are exact inverses, bit for bit.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.distributed import ProcessGroup

from mm_parallel._comm import group_rank, group_size
from mm_parallel.packing import PackedLayout, Packing, packed_layout
from mm_parallel.sequence import Layout, gather_for_usp


def layout_for(
    packed: Packing, ulysses_group: ProcessGroup | None, ring_group: ProcessGroup | None, layout: Layout
) -> PackedLayout:
    """The (cached) :class:`PackedLayout` of ``packed`` over these groups."""
    return packed_layout(packed, group_size(ring_group), group_size(ulysses_group), layout)


def split_packed(
    x: Tensor,
    dim: int,
    packed: Packing,
    ulysses_group: ProcessGroup | None = None,
    ring_group: ProcessGroup | None = None,
    layout: Layout = "zigzag",
) -> Tensor:
    """This rank's share of the full packed tensor ``x`` (``packed.total`` tokens along ``dim``; ``packed``
    a :class:`mm_parallel.PackedSequence` or a :class:`mm_parallel.PackedLayout` for these groups):
    every sample split over the ring with ``layout``, the ring-local sequence cut over Ulysses, padding
    zeros (:class:`mm_parallel.PackedLayout`). Without groups: ``x`` itself."""
    dim = dim % x.dim()
    lay = layout_for(packed, ulysses_group, ring_group, layout)
    lay.packed.check(x, dim, "split_packed")
    if lay.ring == lay.ulysses == 1:
        return x
    index = lay.local_sources(group_rank(ring_group), group_rank(ulysses_group)).to(x.device)
    with_zero = torch.cat([x, x.new_zeros(x.shape[:dim] + (1,) + x.shape[dim + 1 :])], dim=dim)
    return with_zero.index_select(dim, index)


def gather_packed(
    x: Tensor,
    dim: int,
    packed: Packing,
    ulysses_group: ProcessGroup | None = None,
    ring_group: ProcessGroup | None = None,
    layout: Layout = "zigzag",
) -> Tensor:
    """Exact inverse of :func:`split_packed`: the full packed tensor (``packed.total`` tokens along
    ``dim``, padding dropped) on every rank."""
    dim = dim % x.dim()
    lay = layout_for(packed, ulysses_group, ring_group, layout)
    if x.size(dim) != lay.local_len:
        raise ValueError(
            f"gather_packed: dim {dim} holds {x.size(dim)} tokens, a rank's share of the packing is "
            f"{lay.local_len} ({lay.packed.num_samples} samples, {lay.packed.total} tokens)"
        )
    if lay.ring == lay.ulysses == 1:
        return x
    everything = gather_for_usp(x, dim, ulysses_group, ring_group, "contiguous")  # CP order
    return everything.index_select(dim, lay.placement.to(x.device))
