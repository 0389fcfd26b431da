"""Ring attention: KV blocks travel around the ring, blocks merge by online softmax (LSE).

Each of the ``P`` ranks holds ``[B, S/P, H, D]`` of q, k and v (split with
:func:`mm_parallel.split_sequence` using the same ``layout``). In step ``i`` rank ``r`` attends
its queries to the KV block of rank ``r - i`` while the next block is already in flight
(point-to-point send/recv), and merges the block output into its running output with the
block log-sum-exp in float32 (float64 for float64 inputs).

The backward pass is a flash-attention style autograd Function: the KV blocks circulate again;
each block's (dq, dk, dv) is computed from the global output and LSE; dq stays local while the
(dk, dv) accumulators travel with their KV block and arrive back at the owner after ``P`` hops.

Kernels (:mod:`mm_parallel.attention_choice`): ``backend=None`` runs the blocks on the run's
choice (``parallel.attention_backend``) or the device's fused kernel (``cpu_flash``, ``flash`` on
CUDA, ``npu``); a kernel without the LSE or a block backward is refused, never replaced by ``math``.

Padding: ``key_len`` (the real key count of the full sequence; the rest is the end padding of
``split_sequence(..., pad=True)``) is host arithmetic: each block's real keys are a prefix of it
(:func:`mm_parallel.sequence.real_token_counts`), so the block is cut to them and every kernel call
runs without a mask (a causal diagonal block with padding becomes a causal square plus a full
rectangle; a block of padding only is skipped). ``key_padding_mask`` (any pattern, gathered from
the ranks) instead hands every block a ``[B, 1, 1, Sk]`` key mask, which the kernels take as a
broadcast bias (CUDA) or a dense mask (NPU).

Packed sequences (``packed=``, :class:`mm_parallel.PackedSequence`): every sample is split over the ring
on its own (:class:`mm_parallel.PackedLayout`), so a rank holds its share of every sample as local
segments (real tokens, then the sample's padding as a segment of its own). Step ``i`` pairs rank
``r``'s query segments with rank ``r - i``'s key segments (:func:`mm_parallel.packed_blocks.segment_blocks`):
each run of pairs is one varlen kernel call (or one call per pair), merged by LSE like any block. Packed
attention is non-causal and takes no mask: padding never meets a real token. With a ring of one (or
no group) the same pass runs once, without communication.

Causal masking uses global token positions: with the ``contiguous`` layout rank ``r`` skips
blocks from later ranks (rank ``P-1`` does ``P`` times the work of rank 0); with ``zigzag``
(chunks ``r`` and ``2P-1-r``) every off-diagonal step is exactly one half-size block on every
rank, so the work is balanced. Non-causal attention (the DiT case) does full blocks, and its
queries and keys may come from two different split sequences (e.g. video queries, audio keys).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.distributed import ProcessGroup

from mm_parallel._comm import COMPILE_BREAK, all_gather_list, group_rank, group_size, ring_exchange
from mm_parallel.attention_backends import AttentionBackend, attention
from mm_parallel.attention_choice import ring_kernel, warn_if_math_on_accelerator
from mm_parallel.attention_masks import key_length_mask
from mm_parallel.packed_blocks import VarlenBlock, segment_blocks, varlen_backward, varlen_forward
from mm_parallel.packing import PackedLayout, Packing, packed_layout
from mm_parallel.sequence import Layout, _check_layout, real_token_counts

Block = tuple[slice, slice, bool]  # (query slice, key slice, causal inside the block)
AnyBlock = Block | VarlenBlock
_ALL = slice(None)


def block_plan(
    rank: int,
    src: int,
    world: int,
    causal: bool,
    layout: Layout,
    local_len: int,
    real_keys: int | None = None,
    key_local_len: int | None = None,
) -> list[Block]:
    """Which (query, key) sub-blocks rank ``rank`` computes against the KV block of rank ``src``.

    ``real_keys``: how many leading keys of the block are real (None = all); the sub-blocks are cut
    to them, so no kernel call needs a mask. ``key_local_len``: the block's key count (default
    ``local_len``; differs only for non-causal cross-attention).
    """
    blocks = _layout_blocks(rank, src, world, causal, layout, local_len)
    keys = local_len if key_local_len is None else key_local_len
    if real_keys is None or real_keys >= keys:
        return blocks
    return [cut for block in blocks for cut in _cut_to_real_keys(block, real_keys, keys)]


def _layout_blocks(
    rank: int, src: int, world: int, causal: bool, layout: Layout, local_len: int
) -> list[Block]:
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


def _cut_to_real_keys(block: Block, real: int, keys: int) -> list[Block]:
    rows, cols, causal = block
    start, stop, _ = cols.indices(keys)
    stop = min(stop, real)
    if stop <= start:
        return []
    if not causal:
        return [(rows, slice(start, stop), False)]
    # the diagonal block (rows = cols = all): queries before the padding see a causal square, the
    # rest (themselves padding positions) see every real key
    return [(slice(0, stop), slice(0, stop), True), (slice(stop, None), slice(0, stop), False)]


def _seq(t: Tensor, part: slice) -> Tensor:
    """``t[:, part]`` as a ``narrow`` view (python indexing sets a device guard, which CUDA fake tensors
    in a CPU-only torch build cannot take)."""
    start, stop, _ = part.indices(t.size(1))
    return t.narrow(1, start, stop - start)


def _key_mask(key_valid: Tensor) -> Tensor:
    """``[B, Sk]`` real-key mask -> attention mask ``[B, 1, 1, Sk]``."""
    return key_valid.unsqueeze(1).unsqueeze(1)


def _block_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool,
    key_valid: Tensor | None,
    scale: float,
    backend: AttentionBackend,
) -> tuple[Tensor, Tensor]:
    mask = None if key_valid is None else _key_mask(key_valid)
    out, lse = backend.forward(q, k, v, causal=causal, attn_mask=mask, scale=scale)
    if key_valid is not None:  # kernels disagree on rows without any key: LSE -inf, output 0
        has_key = (
            (key_valid.cumsum(-1) > 0).narrow(1, 0, q.size(1)) if causal else key_valid.any(-1, keepdim=True)
        )
        lse = lse.masked_fill(has_key.logical_not().unsqueeze(-1), float("-inf"))
        out = out.masked_fill(has_key.logical_not().unsqueeze(-1).unsqueeze(-1), 0.0)
    return out, lse


def _merge(out: Tensor, lse: Tensor, block_out: Tensor, block_lse: Tensor, rows: slice) -> None:
    """Online-softmax merge of a block result into ``out``/``lse`` rows ``rows`` (in place)."""
    old_lse = _seq(lse, rows)
    block_lse = block_lse.to(lse.dtype)
    new_lse = torch.logaddexp(old_lse, block_lse)
    safe = torch.where(torch.isneginf(new_lse), 0.0, new_lse)
    view = _seq(out, rows)
    view.mul_(torch.exp(old_lse - safe).unsqueeze(-1))
    view.addcmul_(block_out.to(out.dtype), torch.exp(block_lse - safe).unsqueeze(-1))
    old_lse.zero_().add_(new_lse)  # a copy_ (its python binding takes a device guard, see _seq)


def forward_step(
    q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, block: AnyBlock, key_valid: Tensor | None,
    scale: float, backend: AttentionBackend,
) -> None:  # fmt: skip
    """One block of the ring forward: attend ``q`` rows to ``k``/``v`` columns, merge into ``out``/``lse``."""
    if isinstance(block, VarlenBlock):
        rows, cols = block.rows, block.cols
        blk_out, blk_lse = varlen_forward(backend, _seq(q, rows), _seq(k, cols), _seq(v, cols), block, scale)
        _merge(out, lse, blk_out, blk_lse, rows)
        return
    rows, cols, causal = block
    mask = None if key_valid is None else _seq(key_valid, cols)
    blk_out, blk_lse = _block_forward(
        _seq(q, rows), _seq(k, cols), _seq(v, cols), causal, mask, scale, backend
    )
    _merge(out, lse, blk_out, blk_lse, rows)


def backward_step(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dq: Tensor, dk: Tensor,
    dv: Tensor, block: AnyBlock, key_valid: Tensor | None, scale: float, backend: AttentionBackend,
) -> None:  # fmt: skip
    """One block of the ring backward: the block's (dq, dk, dv) from the global ``out``/``lse``,
    added into the accumulators."""
    if isinstance(block, VarlenBlock):
        rows, cols = block.rows, block.cols
        g_q, g_k, g_v = varlen_backward(
            backend, _seq(dout, rows), _seq(q, rows), _seq(k, cols), _seq(v, cols), _seq(out, rows),
            _seq(lse, rows), block, scale,
        )  # fmt: skip
    else:
        rows, cols, causal = block
        mask = None if key_valid is None else _key_mask(_seq(key_valid, cols))
        g_q, g_k, g_v = backend.backward(
            _seq(dout, rows), _seq(q, rows), _seq(k, cols), _seq(v, cols), _seq(out, rows), _seq(lse, rows),
            causal=causal, attn_mask=mask, scale=scale,
        )  # fmt: skip
    _seq(dq, rows).add_(g_q)
    _seq(dk, cols).add_(g_k)
    _seq(dv, cols).add_(g_v)


@dataclass(frozen=True)
class RingPass:
    """What both passes of one ring call share: the group, every source block's key mask (gathered)
    and sub-block plan, the softmax scale and the kernel. ``group=None`` is a ring of one: the pass runs
    once over the local keys, without communication (packed attention on one process)."""

    group: ProcessGroup | None
    masks: list[Tensor | None]
    plans: list[list[AnyBlock]]
    scale: float
    kernel: AttentionBackend

    @classmethod
    def build(
        cls, q: Tensor, k: Tensor, key_padding_mask: Tensor | None, real_keys: list[int] | None,
        group: ProcessGroup, causal: bool, layout: Layout, scale: float, kernel: AttentionBackend,
    ) -> RingPass:  # fmt: skip
        world, rank = group_size(group), group_rank(group)
        masks = all_gather_list(key_padding_mask, group) if key_padding_mask is not None else [None] * world
        plans = [
            block_plan(
                rank,
                src,
                world,
                causal,
                layout,
                q.size(1),
                None if real_keys is None else real_keys[src],
                k.size(1),
            )  # fmt: skip
            for src in range(world)
        ]
        return cls(group, masks, plans, scale, kernel)


def _circulate(
    kv: tuple[Tensor, ...], group: ProcessGroup | None
) -> Iterator[tuple[int, tuple[Tensor, ...]]]:
    """Yield ``(source rank, its KV block)`` for every ring step; the next block is already in flight
    while the caller computes on the current one."""
    world, rank = group_size(group), group_rank(group)
    for step in range(world):
        if step + 1 < world:
            incoming, reqs = ring_exchange(kv, group)
        yield (rank - step) % world, kv
        if step + 1 < world:
            for req in reqs:
                req.wait()
            kv = incoming


def ring_forward(q: Tensor, k: Tensor, v: Tensor, ring: RingPass) -> tuple[Tensor, Tensor]:
    """The forward pass: ``(out, lse)`` in the accumulation dtype (float32, float64 for float64)."""
    cdt = torch.promote_types(q.dtype, torch.float32)
    out = torch.zeros(q.shape, dtype=cdt, device=q.device)
    lse = torch.full(q.shape[:3], float("-inf"), dtype=cdt, device=q.device)  # [B, S, H]
    for src, (k_blk, v_blk) in _circulate((k.contiguous(), v.contiguous()), ring.group):
        for block in ring.plans[src]:
            forward_step(q, k_blk, v_blk, out, lse, block, ring.masks[src], ring.scale, ring.kernel)
    return out, lse


def ring_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, ring: RingPass
) -> tuple[Tensor, Tensor, Tensor]:
    """The backward pass from the forward's ``out`` / ``lse``: ``(dq, dk, dv)`` of this rank's shards."""
    cdt = out.dtype
    out = out.to(q.dtype)  # the kernels read the output in the input dtype: convert once
    dq = torch.zeros(q.shape, dtype=cdt, device=q.device)
    # (dk, dv) accumulators of the visiting KV block
    dkv = tuple(torch.zeros(t.shape, dtype=cdt, device=t.device) for t in (k, v))
    for src, (k_blk, v_blk) in _circulate((k.contiguous(), v.contiguous()), ring.group):
        for block in ring.plans[src]:
            backward_step(
                dout, q, k_blk, v_blk, out, lse, dq, *dkv, block, ring.masks[src], ring.scale, ring.kernel
            )
        if ring.group is None:
            break
        sent = dkv
        dkv, reqs = ring_exchange(sent, ring.group)  # the accumulator follows its KV block
        for req in reqs:
            req.wait()
        del sent
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, ring: RingPass) -> Tensor:  # noqa: ANN001
        out, lse = ring_forward(q, k, v, ring)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring = ring
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout: Tensor) -> tuple[Tensor | None, ...]:  # noqa: ANN001
        return (*ring_backward(dout, *ctx.saved_tensors, ctx.ring), None)


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


@torch.compiler.disable(reason=COMPILE_BREAK)
def ring_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    group: ProcessGroup | None,
    causal: bool = False,
    layout: Layout = "zigzag",
    *,
    key_padding_mask: Tensor | None = None,
    key_len: int | None = None,
    scale: float | None = None,
    backend: str | None = None,
    packed: Packing | None = None,
    query_packed: Packing | None = None,
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
        key_len: instead of a mask, the number of real keys in the full key sequence, whose end was
            padded by ``split_sequence(..., pad=True)``: blocks are cut to their real keys (no mask,
            no mask all-gather). Not together with ``key_padding_mask``.
        scale: softmax scale, default ``1/sqrt(head_dim)``.
        backend: block kernel (a ring-capable name of ``available_backends()``); default the run's
            choice (:func:`mm_parallel.use_attention_backend`) or the device's fused kernel.
        packed: the keys' full sequence is this packing of samples, split with
            :func:`mm_parallel.split_packed` over this ring (no Ulysses); attention stays inside each
            sample. Non-causal, no mask or ``key_len``.
        query_packed: the queries' packing when it differs from ``packed`` (cross-attention between
            two packed streams of the same samples); default ``packed``.

    Returns:
        ``[batch, local_seq, heads, head_dim]`` in ``q.dtype``.
    """
    world = group_size(group)
    _check_inputs(q, k, v, causal, layout, world)
    if key_padding_mask is not None and key_len is not None:
        raise ValueError("ring_attention: pass key_padding_mask or key_len, not both")
    if packed is not None or query_packed is not None:
        _check_packed_call(packed, causal, key_padding_mask, key_len, "ring_attention")
        k_layout = packed_layout(packed, world, 1, layout)  # type: ignore[arg-type]
        q_layout = k_layout if query_packed is None else packed_layout(query_packed, world, 1, layout)
        return packed_ring_attention(q, k, v, group, q_layout, k_layout, scale=scale, backend=backend)
    return _dense_ring_attention(q, k, v, group, causal, layout, key_padding_mask, key_len, scale, backend)


def _dense_ring_attention(
    q: Tensor, k: Tensor, v: Tensor, group: ProcessGroup | None, causal: bool, layout: Layout,
    key_padding_mask: Tensor | None, key_len: int | None, scale: float | None, backend: str | None,
) -> Tensor:  # fmt: skip
    scale = scale if scale is not None else 1.0 / math.sqrt(q.size(-1))
    if group_size(group) == 1:
        return local_attention(
            q, k, v, causal, key_padding_mask=key_padding_mask, key_len=key_len, scale=scale
        )
    ring = plan_ring_pass(q, k, group, causal, layout, key_padding_mask, key_len, scale, backend)  # type: ignore[arg-type]
    return _RingAttention.apply(q, k, v, ring)


def local_attention(
    q: Tensor, k: Tensor, v: Tensor, causal: bool = False, *, key_padding_mask: Tensor | None = None,
    key_len: int | None = None, scale: float | None = None,
) -> Tensor:  # fmt: skip
    """Plain attention (torch SDPA) of a sequence held whole: what ring attention is without a ring.
    Not a graph break: compiled blocks trace it."""
    if key_len is not None:
        key_padding_mask = key_length_mask(k.size(0), k.size(1), key_len, k.device)
    return attention(q, k, v, causal=causal, key_padding_mask=key_padding_mask, scale=scale)


def _check_packed_call(
    packed: Packing | None, causal: bool, key_padding_mask: Tensor | None, key_len: int | None, what: str
) -> None:
    if packed is None:
        raise ValueError(f"{what}: query_packed needs packed (the keys' packing) too")
    if causal or key_padding_mask is not None or key_len is not None:
        raise ValueError(
            f"{what}: packed attention is non-causal and takes no key_padding_mask or key_len (padding is a "
            "segment of its own, never attended by a real token)"
        )


def packed_ring_attention(
    q: Tensor, k: Tensor, v: Tensor, group: ProcessGroup | None, q_layout: PackedLayout, k_layout: PackedLayout,
    *, scale: float | None = None, backend: str | None = None,
) -> Tensor:  # fmt: skip
    """Attention of ring-local packed queries over ring-local packed keys (``[B, ring_local_len, H, D]``),
    segment pairs only; ``group`` ``None`` or size 1: the local sequence alone, no communication."""
    for t, lay, name in ((q, q_layout, "queries"), (k, k_layout, "keys")):
        if t.size(1) != lay.ring_local_len:
            raise ValueError(
                f"packed attention: the {name} hold {t.size(1)} ring-local tokens, their packing splits "
                f"{lay.packed.total} tokens ({lay.packed.num_samples} samples) into {lay.ring_local_len} "
                f"(ring {lay.ring}, ulysses {lay.ulysses}, {lay.layout}); split them with split_packed"
            )
    if group_size(group) == 1:
        return segment_attention(
            q, k, v, q_layout.ring_segments(0), k_layout.ring_segments(0), scale, backend
        )
    return _packed_ring(q, k, v, group, q_layout, k_layout, scale, backend)  # type: ignore[arg-type]


@torch.compiler.disable(reason=COMPILE_BREAK)
def _packed_ring(
    q: Tensor, k: Tensor, v: Tensor, group: ProcessGroup, q_layout: PackedLayout, k_layout: PackedLayout,
    scale: float | None, backend: str | None,
) -> Tensor:  # fmt: skip
    return _RingAttention.apply(
        q, k, v, plan_packed_ring_pass(q, k, group, q_layout, k_layout, scale, backend)
    )


def plan_packed_ring_pass(
    q: Tensor, k: Tensor, group: ProcessGroup, q_layout: PackedLayout, k_layout: PackedLayout,
    scale: float | None, backend: str | None,
) -> RingPass:  # fmt: skip
    """The kernel and every step's segment blocks of a packed ring call: step ``src`` pairs this rank's
    query segments with rank ``src``'s key segments."""
    scale = scale if scale is not None else 1.0 / math.sqrt(q.size(-1))
    kernel = ring_kernel(q.device, backend)
    warn_if_math_on_accelerator(kernel, q, k)
    world, rank = group_size(group), group_rank(group)
    plans = [
        segment_blocks(q_layout.ring_segments(rank), k_layout.ring_segments(src)) for src in range(world)
    ]
    return RingPass(group, [None] * world, plans, scale, kernel)  # type: ignore[arg-type]


def segment_attention(
    q: Tensor, k: Tensor, v: Tensor, q_segments: tuple[int, ...], k_segments: tuple[int, ...],
    scale: float | None = None, backend: str | None = None,
) -> Tensor:  # fmt: skip
    """Query segment ``j`` attends to key segment ``j`` only, on one process (a ring pass of one, no
    communication); query rows whose segment has no key get zeros."""
    _check_inputs(q, k, v, False, "contiguous", 1)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.size(-1))
    kernel = ring_kernel(q.device, backend)
    warn_if_math_on_accelerator(kernel, q, k)
    ring = RingPass(None, [None], [segment_blocks(q_segments, k_segments)], scale, kernel)
    return _RingAttention.apply(q, k, v, ring)


def plan_ring_pass(
    q: Tensor, k: Tensor, group: ProcessGroup, causal: bool, layout: Layout, key_padding_mask: Tensor | None,
    key_len: int | None, scale: float, backend: str | None,
) -> RingPass:  # fmt: skip
    """Resolve the kernel and every block's plan of a ring call (what :func:`ring_attention` runs)."""
    kernel = ring_kernel(q.device, backend)
    if key_padding_mask is not None and not kernel.supports_mask:
        raise ValueError(f"ring_attention: backend {kernel.name!r} takes no key padding mask; pass key_len")
    warn_if_math_on_accelerator(kernel, q, k)
    world = group_size(group)
    real_keys = None if key_len is None else real_token_counts(key_len, k.size(1), world, layout)
    return RingPass.build(q, k, key_padding_mask, real_keys, group, causal, layout, scale, kernel)
