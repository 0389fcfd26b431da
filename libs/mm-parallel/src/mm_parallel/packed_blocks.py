"""Attention between two packed token runs, segment by segment: the block plan and the kernel call.

Queries and keys each come as consecutive segments, paired by index (segment ``j`` of the queries
attends to segment ``j`` of the keys only; :class:`mm_parallel.PackedLayout` gives a rank's segments).
:func:`segment_blocks` turns two segment lists into kernel calls: each :class:`VarlenBlock` covers a
run of consecutive pairs that are non-empty on both sides, so its query rows and key columns are each
one contiguous range, tiled by its segments (what a varlen kernel takes: ``cu_seqlens_q`` /
``cu_seqlens_k`` without gaps). A pair empty on one side ends a run: its queries get nothing from
these keys, or its keys serve no query here. A run of one pair is a plain dense block.

:func:`varlen_forward` / :func:`varlen_backward` run one :class:`VarlenBlock` on a kernel: its native
variable-length entry (``AttentionBackend.varlen_forward``: flash_attn's varlen functions, torch's
CUDA flash kernel with ``cum_seq``, ``npu_fusion_attention`` in TND layout) when it has one, else one
dense call per segment pair (:func:`segmentwise_forward`), which is exact on every kernel. Packed
attention is non-causal (the video DiTs' self-attention); a segment pair has no mask.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate
from typing import NamedTuple, Protocol

import torch
from torch import Tensor


class VarlenKernel(Protocol):
    """What the varlen helpers use of a kernel (an :class:`~mm_parallel.AttentionBackend` has it): its dense
    ``forward`` / ``backward`` and, where the kernel has them, native ``varlen_forward`` / ``varlen_backward``
    (None otherwise). A protocol rather than that class: the kernels' modules import this one."""

    forward: Callable[..., tuple[Tensor, Tensor]]
    backward: Callable[..., tuple[Tensor, Tensor, Tensor]] | None
    varlen_forward: Callable[..., tuple[Tensor, Tensor]] | None
    varlen_backward: Callable[..., tuple[Tensor, Tensor, Tensor]] | None


class VarlenBlock(NamedTuple):
    """Query rows ``rows`` against key columns ``cols``, both tiled by paired segments (all > 0)."""

    rows: slice
    cols: slice
    q_lengths: tuple[int, ...]
    k_lengths: tuple[int, ...]


def segment_blocks(q_segments: tuple[int, ...], k_segments: tuple[int, ...]) -> list[VarlenBlock]:
    """The kernel calls of segment-paired attention (module doc): runs of pairs non-empty on both sides."""
    if len(q_segments) != len(k_segments):
        raise ValueError(
            f"packed attention pairs segments by index: {len(q_segments)} query segments, {len(k_segments)} key "
            "segments (the query and key streams must pack the same number of samples)"
        )
    blocks: list[VarlenBlock] = []
    run: list[tuple[int, int, int, int]] = []  # (row start, col start, q length, k length)
    row = col = 0
    for lq, lk in zip(q_segments, k_segments, strict=True):
        if lq and lk:
            run.append((row, col, lq, lk))
        elif lq or lk:  # one side empty: the ranges of a run would have a gap here
            _flush(run, blocks)
        row, col = row + lq, col + lk
    _flush(run, blocks)
    return blocks


def _flush(run: list[tuple[int, int, int, int]], blocks: list[VarlenBlock]) -> None:
    if run:
        (row, col, _, _), (last_row, last_col, last_q, last_k) = run[0], run[-1]
        rows, cols = slice(row, last_row + last_q), slice(col, last_col + last_k)
        blocks.append(VarlenBlock(rows, cols, tuple(r[2] for r in run), tuple(r[3] for r in run)))
        run.clear()


def _spans(lengths: tuple[int, ...]) -> list[tuple[int, int]]:
    starts = (0, *accumulate(lengths))
    return [(starts[i], n) for i, n in enumerate(lengths)]


def segmentwise_forward(
    forward: Callable[..., tuple[Tensor, Tensor]], q: Tensor, k: Tensor, v: Tensor, q_lengths: tuple[int, ...],
    k_lengths: tuple[int, ...], *, scale: float,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """A varlen block as one dense ``forward`` (a kernel's) per segment pair; ``(out, lse)`` of all rows."""
    outs, lses = [], []
    for (qs, lq), (ks, lk) in zip(_spans(q_lengths), _spans(k_lengths), strict=True):
        out, lse = forward(
            q.narrow(1, qs, lq), k.narrow(1, ks, lk), v.narrow(1, ks, lk), causal=False, scale=scale
        )
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs, 1), torch.cat(lses, 1)


def segmentwise_backward(
    backward: Callable[..., tuple[Tensor, Tensor, Tensor]], dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
    q_lengths: tuple[int, ...], k_lengths: tuple[int, ...], *, scale: float,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Gradients of a varlen block from the global ``out`` / ``lse``, one dense ``backward`` per pair."""
    dqs, dks, dvs = [], [], []
    for (qs, lq), (ks, lk) in zip(_spans(q_lengths), _spans(k_lengths), strict=True):
        rows = (t.narrow(1, qs, lq) for t in (dout, q))
        dq, dk, dv = backward(
            *rows, k.narrow(1, ks, lk), v.narrow(1, ks, lk), out.narrow(1, qs, lq), lse.narrow(1, qs, lq),
            causal=False, scale=scale,
        )  # fmt: skip
        dqs.append(dq)
        dks.append(dk)
        dvs.append(dv)
    return torch.cat(dqs, 1), torch.cat(dks, 1), torch.cat(dvs, 1)


def varlen_forward(
    kernel: VarlenKernel, q: Tensor, k: Tensor, v: Tensor, block: VarlenBlock, scale: float
) -> tuple[Tensor, Tensor]:
    """``(out, lse)`` of ``block``'s rows: the kernel's native varlen call, or one call per pair."""
    if len(block.q_lengths) > 1 and kernel.varlen_forward is not None:
        return kernel.varlen_forward(q, k, v, block.q_lengths, block.k_lengths, scale=scale)
    return segmentwise_forward(kernel.forward, q, k, v, block.q_lengths, block.k_lengths, scale=scale)


def varlen_backward(
    kernel: VarlenKernel, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
    block: VarlenBlock, scale: float,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """``(dq, dk, dv)`` of ``block`` from the global ``out`` / ``lse`` of its rows."""
    args = (dout, q, k, v, out, lse, block.q_lengths, block.k_lengths)
    if len(block.q_lengths) > 1 and kernel.varlen_backward is not None:
        return kernel.varlen_backward(*args, scale=scale)
    return segmentwise_backward(kernel.backward, *args, scale=scale)  # type: ignore[arg-type]
