"""Packed (variable-length) attention on one process: each sample's queries attend to its keys only.

``packed_attention(q, k, v, packed)`` is block-diagonal attention over ``[B, T, H, D]`` tensors of
concatenated samples, with the kernels of :mod:`mm_parallel.packed_blocks` (varlen where a kernel has
it, one dense call per sample otherwise) and an exact backward from the output and LSE. The
context-parallel forms are ``ulysses_attention`` / ``ring_attention`` / ``usp_attention(packed=...)``
and :class:`mm_parallel.SequenceParallelPlan` with a packed stream.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from mm_parallel.packing import PackedSequence
from mm_parallel.ring import segment_attention

Segments = PackedSequence | Sequence[int]


def _segments(packing: Segments, tokens: int, what: str) -> tuple[int, ...]:
    segments = packing.lengths if isinstance(packing, PackedSequence) else tuple(int(n) for n in packing)
    if any(n < 0 for n in segments) or sum(segments) != tokens:
        raise ValueError(
            f"packed_attention: the {what} hold {tokens} tokens, their segments {list(segments)} sum to "
            f"{sum(segments)} (lengths must be >= 0)"
        )
    return segments


def packed_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    packed: Segments,
    key_packed: Segments | None = None,
    *,
    scale: float | None = None,
    backend: str | None = None,
) -> Tensor:
    """Attention of ``q`` over ``k`` / ``v`` (``[batch, tokens, heads, head_dim]``) inside each segment.

    Args:
        packed: the queries' segments: a :class:`mm_parallel.PackedSequence`, or segment lengths (zeros
            allowed, e.g. :meth:`mm_parallel.SequenceParallelPlan.local_segments`).
        key_packed: the keys' segments, paired with the queries' by index (cross-attention, e.g. each
            sample's video tokens to its own text); default ``packed`` (self-attention).
        scale: softmax scale, default ``1/sqrt(head_dim)``.
        backend: the kernel (a ring-capable name of ``available_backends()``); default the run's choice
            (:func:`mm_parallel.use_attention_backend`) or the device's fused kernel.

    Returns:
        ``[batch, tokens, heads, head_dim]`` in ``q.dtype``; queries whose segment has no key get zeros.
    """
    q_segments = _segments(packed, q.size(1), "queries")
    k_segments = q_segments if key_packed is None else _segments(key_packed, k.size(1), "keys")
    if key_packed is None and k.size(1) != q.size(1):
        raise ValueError(f"packed_attention: {q.size(1)} queries and {k.size(1)} keys; pass key_packed")
    return segment_attention(q, k, v, q_segments, k_segments, scale, backend)
