"""USP (unified sequence parallel): Ulysses inside, Ring across.

Rank (ring r, ulysses u) holds piece ``u`` of ring rank ``r``'s share of the sequence (see
:func:`mm_parallel.split_for_usp`). ``usp_attention``:

1. Ulysses all-to-all over ``ulysses_group``: ``[B, S/(RU), H, D] -> [B, S/R, H/U, D]``, the
   ring-local sequence for ``H/U`` heads;
2. ring attention over ``ring_group`` on that ring-local sequence (``layout`` as split); without a
   ring, plain attention of the whole sequence;
3. the inverse all-to-all: ``[B, S/R, H/U, D] -> [B, S/(RU), H, D]``.

The steps are undone in exact reverse order, and every step is autograd-aware. Without a ring a
compiled block traces all three (functional all-to-alls); with a ring, step 2 is a graph break
(:data:`mm_parallel._comm.COMPILE_BREAK`). ``overlap_heads`` pipelines steps 1-3 over head groups,
``overlap_projections`` starts step 1 of q while k is projected, then of k while v is
(:mod:`mm_parallel.ulysses`). ``packed=`` runs packed sequences (:class:`mm_parallel.PackedLayout`).
"""

from __future__ import annotations

from torch import Tensor
from torch.distributed import ProcessGroup

from mm_parallel._comm import group_size
from mm_parallel.packing import Packing, packed_layout
from mm_parallel.ring import _check_packed_call, local_attention, packed_ring_attention, ring_attention
from mm_parallel.sequence import Layout
from mm_parallel.ulysses import (
    Attend,
    Project,
    check_heads_divisible,
    gather_key_padding_mask,
    takes_projections,
    ulysses_pipeline,
)


@takes_projections
def usp_attention(
    q: Tensor | Project,
    k: Tensor | Project,
    v: Tensor | Project,
    ulysses_group: ProcessGroup | None,
    ring_group: ProcessGroup | None,
    causal: bool = False,
    layout: Layout = "zigzag",
    *,
    key_padding_mask: Tensor | None = None,
    key_len: int | None = None,
    scale: float | None = None,
    backend: str | None = None,
    packed: Packing | None = None,
    query_packed: Packing | None = None,
    overlap_heads: int | None = None,
    overlap_projections: bool | None = None,
) -> Tensor:
    """Attention over a sequence split with :func:`split_for_usp` (``[B, S/(RU), H, D]`` per rank).

    Args:
        q, k, v: local ``[batch, local_seq, heads, head_dim]``; heads divisible by the ulysses size; or
            projections returning them (:data:`mm_parallel.ulysses.Project`, called once each, q first).
        ulysses_group, ring_group: the two CP groups (``None`` or size 1 disables that dimension;
            both ``None`` = plain attention).
        causal: causal over global positions.
        layout: the ring layout used by ``split_for_usp``.
        key_padding_mask: local ``[B, S/(RU)]`` bool, True = real token, split like k/v.
        key_len: instead of a mask, the real key count of the full sequence split with
            ``split_for_usp(..., pad=True)`` (its end is padding): ring blocks are cut to their real
            keys, nothing is gathered (see :func:`mm_parallel.ring_attention`).
        scale: softmax scale, default ``1/sqrt(head_dim)``.
        backend: ring block kernel (see :func:`mm_parallel.ring_attention`).
        packed: the keys' full sequence is this packing of samples, split with
            :func:`mm_parallel.split_packed` over these groups; attention stays inside each sample
            (non-causal, no mask or ``key_len``).
        query_packed: the queries' packing when it differs from ``packed`` (same samples); default ``packed``.
        overlap_heads: Ulysses head groups whose all-to-alls overlap the other groups' attention
            (:mod:`mm_parallel.ulysses`); 1 = off, ``None`` = the device's default without a ring, off
            with one.
        overlap_projections: start each projection's Ulysses all-to-all before the next projection
            (:mod:`mm_parallel.ulysses`); ``None`` = the device's default without a ring, off with one.

    Returns:
        ``[batch, local_seq, heads, head_dim]``.
    """
    ulysses, ring = group_size(ulysses_group), group_size(ring_group)
    q = q() if callable(q) else q
    check_heads_divisible(q.size(2), ulysses, "usp_attention")
    # the device defaults are measured for Ulysses alone: with a ring, overlap only when asked
    if ring > 1:
        overlap_heads = 1 if overlap_heads is None else overlap_heads
        overlap_projections = bool(overlap_projections)
    attend: Attend
    if packed is not None or query_packed is not None:
        _check_packed_call(packed, causal, key_padding_mask, key_len, "usp_attention")
        k_layout = packed_layout(packed, ring, ulysses, layout)  # type: ignore[arg-type]
        q_layout = k_layout if query_packed is None else packed_layout(query_packed, ring, ulysses, layout)

        def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return packed_ring_attention(
                q, k, v, ring_group, q_layout, k_layout, scale=scale, backend=backend
            )

    else:
        kpm = gather_key_padding_mask(key_padding_mask, ulysses_group)

        def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            if ring == 1:
                return local_attention(q, k, v, causal, key_padding_mask=kpm, key_len=key_len, scale=scale)
            return ring_attention(
                q, k, v, ring_group, causal, layout, key_padding_mask=kpm, key_len=key_len, scale=scale,
                backend=backend,
            )  # fmt: skip

    # 1. ulysses: [B, S/(RU), H, D] -> [B, S/R, H/U, D]; 2. ring (or local) attention; 3. back
    return ulysses_pipeline(q, k, v, ulysses_group, lambda heads: attend, overlap_heads, overlap_projections)
