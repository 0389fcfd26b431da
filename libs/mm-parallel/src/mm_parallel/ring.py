"""Ring attention: KV blocks travel around the ring, blocks merge by online softmax (LSE).

Each of the ``P`` ranks holds ``[B, S/P, H, D]`` of q, k and v (split with
:func:`mm_parallel.split_sequence` using the same ``layout``). In step ``i`` rank ``r`` attends
its queries to the KV block of rank ``r - i`` while the next block is already in flight
(point-to-point send/recv), and merges the block output into its running output with the
block log-sum-exp in float32 (float64 for float64 inputs).

The backward pass is a flash-attention style autograd Function: the KV blocks circulate again;
each block's (dq, dk, dv) is computed from the global output and LSE; dq stays local while the
(dk, dv) accumulators travel with their KV block and arrive back at the owner after ``P`` hops.

Causal masking uses global token positions: with the ``contiguous`` layout rank ``r`` skips
blocks from later ranks (rank ``P-1`` does ``P`` times the work of rank 0); with ``zigzag``
(chunks ``r`` and ``2P-1-r``) every off-diagonal step is exactly one half-size block on every
rank, so the work is balanced. Non-causal attention (the DiT case) does full blocks, and its
queries and keys may come from two different split sequences (e.g. video queries, audio keys).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.distributed import ProcessGroup

from mm_parallel._comm import all_gather_list, group_rank, group_size, ring_exchange
from mm_parallel.attention_backends import (
    AttentionBackend,
    attention,
    default_lse_backend,
    get_backend,
)
from mm_parallel.sequence import Layout, _check_layout

Block = tuple[slice, slice, bool]  # (query slice, key slice, causal inside the block)
_ALL = slice(None)


def block_plan(rank: int, src: int, world: int, causal: bool, layout: Layout, local_len: int) -> list[Block]:
    """Which (query, key) sub-blocks rank ``rank`` computes against the KV block of rank ``src``."""
    if not causal:
        return [(_ALL, _ALL, False)]
    if src == rank:  # local positions increase with global ones in both layouts
        return [(_ALL, _ALL, True)]
    if layout == "contiguous":
        return [(_ALL, _ALL, False)] if src < rank else []
    half = local_len // 2
    if src < rank:  # key chunk src precedes both query chunks; key chunk 2P-1-src follows both
        return [(_ALL, slice(0, half), False)]
    return [(slice(half, None), _ALL, False)]  # only query chunk 2P-1-r sees (all of) block src


def _kernel(
    backend: AttentionBackend, key_valid: Tensor | None, need_backward: bool = False
) -> AttentionBackend:
    """The backend to run a block on: fall back to ``math`` for masks / missing block backward."""
    if key_valid is not None and not backend.supports_mask:
        return get_backend("math")
    if need_backward and backend.backward is None:
        return get_backend("math")
    return backend


def _block_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool,
    key_valid: Tensor | None,
    scale: float,
    backend: AttentionBackend,
) -> tuple[Tensor, Tensor]:
    kernel = _kernel(backend, key_valid)
    mask = None if key_valid is None else key_valid[:, None, None, :]
    out, lse = kernel.forward(q, k, v, causal=causal, attn_mask=mask, scale=scale)
    if key_valid is not None:  # kernels disagree on rows without any key: make their LSE -inf
        has_key = (key_valid.cumsum(-1) > 0)[:, : q.size(1)] if causal else key_valid.any(-1, keepdim=True)
        lse = lse.masked_fill(~has_key[..., None], float("-inf"))
    return out, lse


def _merge(out: Tensor, lse: Tensor, block_out: Tensor, block_lse: Tensor, rows: slice) -> None:
    """Online-softmax merge of a block result into ``out``/``lse`` rows ``rows`` (in place)."""
    old_lse = lse[:, rows]
    block_lse = block_lse.to(lse.dtype)
    new_lse = torch.logaddexp(old_lse, block_lse)
    safe = torch.where(torch.isneginf(new_lse), 0.0, new_lse)
    view = out[:, rows]
    view.mul_(torch.exp(old_lse - safe)[..., None])
    view.addcmul_(block_out.to(out.dtype), torch.exp(block_lse - safe)[..., None])
    lse[:, rows] = new_lse


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(  # noqa: ANN205
        ctx,  # noqa: ANN001
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Tensor | None,
        group: ProcessGroup,
        causal: bool,
        layout: Layout,
        scale: float,
        backend: AttentionBackend,
    ):
        world, rank = group_size(group), group_rank(group)
        cdt = torch.promote_types(q.dtype, torch.float32)
        masks = all_gather_list(key_padding_mask, group) if key_padding_mask is not None else [None] * world
        out = torch.zeros(q.shape, dtype=cdt, device=q.device)
        lse = torch.full(q.shape[:3], float("-inf"), dtype=cdt, device=q.device)  # [B, S, H]
        kv = (k.contiguous(), v.contiguous())
        for step in range(world):
            src = (rank - step) % world
            if step + 1 < world:
                incoming, reqs = ring_exchange(kv, group)
            for rows, cols, blk_causal in block_plan(rank, src, world, causal, layout, q.size(1)):
                mask = None if masks[src] is None else masks[src][:, cols]
                blk_out, blk_lse = _block_forward(
                    q[:, rows], kv[0][:, cols], kv[1][:, cols], blk_causal, mask, scale, backend
                )
                _merge(out, lse, blk_out, blk_lse, rows)
                del blk_out, blk_lse
            if step + 1 < world:
                for req in reqs:
                    req.wait()
                kv = incoming
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (masks, group, causal, layout, scale, backend)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout: Tensor):  # noqa: ANN001, ANN205
        q, k, v, out, lse = ctx.saved_tensors
        masks, group, causal, layout, scale, backend = ctx.args
        world, rank = group_size(group), group_rank(group)
        cdt = out.dtype
        dq = torch.zeros(q.shape, dtype=cdt, device=q.device)
        # (dk, dv) accumulators of the visiting KV block
        dkv = tuple(torch.zeros(t.shape, dtype=cdt, device=t.device) for t in (k, v))
        kv = (k.contiguous(), v.contiguous())
        for step in range(world):
            src = (rank - step) % world
            if step + 1 < world:
                incoming, reqs = ring_exchange(kv, group)
            for rows, cols, blk_causal in block_plan(rank, src, world, causal, layout, q.size(1)):
                mask = None if masks[src] is None else masks[src][:, cols]
                kernel = _kernel(backend, mask, need_backward=True)
                g_q, g_k, g_v = kernel.backward(
                    dout[:, rows],
                    q[:, rows],
                    kv[0][:, cols],
                    kv[1][:, cols],
                    out[:, rows],
                    lse[:, rows],
                    causal=blk_causal,
                    attn_mask=None if mask is None else mask[:, None, None, :],
                    scale=scale,
                )
                dq[:, rows] += g_q
                dkv[0][:, cols] += g_k
                dkv[1][:, cols] += g_v
                del g_q, g_k, g_v
            if step + 1 < world:
                for req in reqs:
                    req.wait()
                kv = incoming
            sent = dkv
            dkv, reqs = ring_exchange(sent, group)  # the accumulator follows its KV block
            for req in reqs:
                req.wait()
            del sent
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None, None, None


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, causal: bool, layout: str, world: int) -> None:
    _check_layout(layout)
    if q.dim() != 4 or k.shape != v.shape or (q.size(0), *q.shape[2:]) != (k.size(0), *k.shape[2:]):
        raise ValueError(
            "ring_attention: q, k, v must be [batch, local_seq, heads, head_dim] with one batch, heads and "
            f"head_dim (k and v of one shape), got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if causal and q.size(1) != k.size(1):
        raise ValueError(
            f"ring_attention: causal attention needs queries and keys of one length, got {q.size(1)} and "
            f"{k.size(1)} local tokens"
        )
    if layout == "zigzag" and world > 1 and (q.size(1) % 2 or k.size(1) % 2):
        raise ValueError(
            f"ring_attention: zigzag needs even local sequence lengths, got {q.size(1)} and {k.size(1)}"
        )


def ring_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    group: ProcessGroup | None,
    causal: bool = False,
    layout: Layout = "zigzag",
    *,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
    backend: str | None = None,
) -> Tensor:
    """Attention over a sequence split across the ring ``group`` (``[B, S/P, H, D]`` per rank).

    Args:
        q, k, v: local shards, split with ``split_sequence(..., layout=layout)``. Non-causal
            attention may have queries and keys of different lengths (cross-attention between two
            split streams): q ``[B, Sq/P, H, D]``, k and v ``[B, Sk/P, H, D]``.
        group: the ring process group; ``None`` or size 1 = plain attention (torch SDPA).
        causal: causal over GLOBAL positions (the layout says which positions a rank holds).
        layout: ``"zigzag"`` (load-balanced for causal) or ``"contiguous"``.
        key_padding_mask: local ``[B, S/P]`` bool, True = real token, split like k/v. Arbitrary
            ``[S, S]`` masks are not supported by ring attention.
        scale: softmax scale, default ``1/sqrt(head_dim)``.
        backend: LSE-returning kernel for the blocks (see ``lse_backends()``); default
            ``cpu_flash`` on CPU, ``flash_attn`` on CUDA when installed, else ``math``.

    Returns:
        ``[batch, local_seq, heads, head_dim]`` in ``q.dtype``.
    """
    world = group_size(group)
    _check_inputs(q, k, v, causal, layout, world)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.size(-1))
    if world == 1:
        return attention(q, k, v, causal=causal, key_padding_mask=key_padding_mask, scale=scale)
    kernel = get_backend(backend or default_lse_backend(q.device))
    if not kernel.returns_lse:
        raise ValueError(
            f"ring_attention: backend {kernel.name!r} does not return the LSE the ring merge needs"
        )
    return _RingAttention.apply(q, k, v, key_padding_mask, group, causal, layout, scale, kernel)
