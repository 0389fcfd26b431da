"""USP (unified sequence parallel): Ulysses inside, Ring across.

Rank (ring r, ulysses u) holds piece ``u`` of ring rank ``r``'s share of the sequence (see
:func:`mm_parallel.split_for_usp`). ``usp_attention``:

1. Ulysses all-to-all over ``ulysses_group``: ``[B, S/(RU), H, D] -> [B, S/R, H/U, D]``, the
   ring-local sequence for ``H/U`` heads;
2. ring attention over ``ring_group`` on that ring-local sequence (``layout`` as split);
3. the inverse all-to-all: ``[B, S/R, H/U, D] -> [B, S/(RU), H, D]``.

The steps are undone in exact reverse order, and every step is autograd-aware.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.distributed import ProcessGroup

from mm_parallel._comm import COMPILE_BREAK, group_size
from mm_parallel.ring import ring_attention
from mm_parallel.sequence import Layout
from mm_parallel.ulysses import check_heads_divisible, gather_key_padding_mask, heads_to_seq, seq_to_heads


@torch.compiler.disable(reason=COMPILE_BREAK)
def usp_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ulysses_group: ProcessGroup | None,
    ring_group: ProcessGroup | None,
    causal: bool = False,
    layout: Layout = "zigzag",
    *,
    key_padding_mask: Tensor | None = None,
    key_len: int | None = None,
    scale: float | None = None,
    backend: str | None = None,
) -> Tensor:
    """Attention over a sequence split with :func:`split_for_usp` (``[B, S/(RU), H, D]`` per rank).

    Args:
        q, k, v: local ``[batch, local_seq, heads, head_dim]``; heads divisible by the ulysses size.
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

    Returns:
        ``[batch, local_seq, heads, head_dim]``.
    """
    check_heads_divisible(q.size(2), group_size(ulysses_group), "usp_attention")
    kpm = gather_key_padding_mask(key_padding_mask, ulysses_group)
    # 1. ulysses: [B, S/(RU), H, D] -> [B, S/R, H/U, D]
    q, k, v = (seq_to_heads(t, ulysses_group) for t in (q, k, v))
    # 2. ring over the ring-local sequence
    out = ring_attention(
        q,
        k,
        v,
        ring_group,
        causal,
        layout,
        key_padding_mask=kpm,
        key_len=key_len,
        scale=scale,
        backend=backend,
    )
    # 3. ulysses back: [B, S/R, H/U, D] -> [B, S/(RU), H, D]
    return heads_to_seq(out, ulysses_group)
