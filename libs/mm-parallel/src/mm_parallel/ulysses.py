"""Ulysses (DeepSpeed-style) sequence parallel attention: all-to-all sequence <-> heads.

Each rank holds ``[B, S/P, H, D]``; an all-to-all gives it ``[B, S, H/P, D]`` (the full
sequence for ``H/P`` heads), attention runs locally, and the inverse all-to-all restores
``[B, S/P, H, D]``. The full sequence after the all-to-all is the concatenation of the ranks'
local sequences, i.e. global order for the ``contiguous`` split layout: use that layout for
causal attention or position-dependent masks (non-causal attention without a mask is order
independent, so any layout works).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.distributed import ProcessGroup

from mm_parallel._comm import COMPILE_BREAK, all_gather_list, all_to_all, group_rank, group_size
from mm_parallel.attention_backends import attention, combine_masks, key_padding_to_attn_mask

AttnFn = Callable[..., Tensor]


def check_heads_divisible(heads: int, world: int, what: str = "ulysses") -> None:
    """Raise a clear error if ``heads`` cannot be split over ``world`` ranks."""
    if heads % world:
        raise ValueError(
            f"{what}: {heads} attention heads are not divisible by the ulysses group size {world}; "
            f"choose ulysses_parallel_size dividing {heads}"
        )


def seq_to_heads(x: Tensor, group: ProcessGroup | None) -> Tensor:
    """``[B, S/P, H, D]`` -> ``[B, S, H/P, D]`` (autograd-aware all-to-all)."""
    return all_to_all(x, scatter_dim=2, gather_dim=1, group=group)


def heads_to_seq(x: Tensor, group: ProcessGroup | None) -> Tensor:
    """``[B, S, H/P, D]`` -> ``[B, S/P, H, D]`` (inverse of :func:`seq_to_heads`)."""
    return all_to_all(x, scatter_dim=1, gather_dim=2, group=group)


def gather_key_padding_mask(key_padding_mask: Tensor | None, group: ProcessGroup | None) -> Tensor | None:
    """Concatenate the ranks' local ``[B, S/P]`` key padding masks into ``[B, S]`` (no gradient)."""
    if key_padding_mask is None or group_size(group) == 1:
        return key_padding_mask
    import torch

    return torch.cat(all_gather_list(key_padding_mask, group), dim=1)


def _local_heads_mask(attn_mask: Tensor | None, heads: int, group: ProcessGroup | None) -> Tensor | None:
    """Keep this rank's heads of a full-head ``[B, H, S, S]`` mask (broadcast head dims pass through)."""
    if attn_mask is None or attn_mask.dim() < 3 or attn_mask.size(-3) == 1:
        return attn_mask
    world = group_size(group)
    if attn_mask.size(-3) != heads * world:
        raise ValueError(
            f"attn_mask head dim {attn_mask.size(-3)} is neither 1 nor the number of heads {heads * world}"
        )
    return attn_mask.chunk(world, dim=-3)[group_rank(group)]


@torch.compiler.disable(reason=COMPILE_BREAK)
def ulysses_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    group: ProcessGroup | None,
    attn_fn: AttnFn | None = None,
    attn_mask: Tensor | None = None,
    *,
    key_padding_mask: Tensor | None = None,
    **kw: object,
) -> Tensor:
    """Attention over the full sequence held as ``[B, S/P, H, D]`` shards on ``group``.

    Args:
        q, k, v: local ``[batch, local_seq, heads, head_dim]``; ``heads`` divisible by the group size.
        group: the ulysses process group; ``None`` or size 1 = plain attention.
        attn_fn: ``attn_fn(q, k, v, attn_mask=..., **kw)`` on ``[B, S, H/P, D]``; default
            :func:`mm_parallel.attention` (torch SDPA), which takes ``causal=`` and ``scale=``.
        attn_mask: mask over the FULL sequence, broadcastable to ``[B, H, S, S]`` (bool True =
            attend, or additive float); a head dim of size ``H`` is sliced to this rank's heads.
        key_padding_mask: local ``[B, S/P]`` bool, True = real token (split like q/k/v); it is
            gathered and folded into the ``attn_mask`` handed to ``attn_fn``.
        **kw: passed to ``attn_fn`` (e.g. ``causal=True``, ``scale=0.1``).

    Returns:
        ``[batch, local_seq, heads, head_dim]``.
    """
    attn_fn = attn_fn or attention
    world = group_size(group)
    check_heads_divisible(q.size(2), world)
    kpm = gather_key_padding_mask(key_padding_mask, group)
    mask = _local_heads_mask(attn_mask, q.size(2) // world, group)
    if kpm is not None:
        mask = combine_masks(mask, key_padding_to_attn_mask(kpm))
    # 1. [B, S/P, H, D] -> [B, S, H/P, D]
    q, k, v = (seq_to_heads(t, group) for t in (q, k, v))
    # 2. attention over the full sequence for this rank's heads
    out = attn_fn(q, k, v, attn_mask=mask, **kw)
    # 3. [B, S, H/P, D] -> [B, S/P, H, D]
    return heads_to_seq(out, group)
