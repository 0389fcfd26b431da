"""Ascend NPU block kernels for ring attention: ``torch_npu.npu_fusion_attention`` and its grad.

Same contract as :mod:`mm_parallel.cuda_attention`: ``[B, S, H, D]`` in and out, forward returns
``(out, lse [B, Sq, H])``, backward takes the global ``out`` / ``lse`` of its rows.

What the adapter relies on (torch_npu API reference, ``torch_npu.npu_fusion_attention``, Ascend
PyTorch 6.0.0: hiascend.com/document/detail/zh/Pytorch/600/apiref/apilist/ptaoplist_000850.html, and
CANN 7.0 ptaoplist_000139 for ``sparse_mode``):

- ``npu_fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None,
  atten_mask=None, scale=1., keep_prob=1., pre_tockens=2147483647, next_tockens=2147483647,
  inner_precise=0, prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0,
  gen_mask_parallel=True, sync=False) -> (attention_out, softmax_max, softmax_sum, softmax_out,
  seed, offset, numels)``. ``input_layout="BSND"`` is our ``[B, S, H, D]``; ``scale`` defaults to 1
  (not ``1/sqrt(D)``), so it is always passed.
- ``atten_mask`` is bool with the opposite polarity of SDPA: True (1) = the position is masked out,
  False (0) = it takes part; shapes ``BNSS``, ``B1SS``, ``11SS`` or ``SS``. ``sparse_mode=2``
  (leftUpCausal) takes the compressed ``2048 x 2048`` upper-triangular mask instead of a full one.
- ``softmax_max`` / ``softmax_sum`` are float32 ``[B, N, Sq, 8]`` (each row's value repeated 8 times;
  the layout in the op-plugin fake registrations, gitcode.com/Ascend/op-plugin
  ``op_plugin/python/meta/_fake_registrations.py``, and MindSpeed's ``npu_ring_attention_update``
  doc); the probabilities are ``exp(s - softmax_max) / softmax_sum``, so the row LSE is
  ``softmax_max + log(softmax_sum)``.
- ``npu_fusion_attention_grad(query, key, value, dy, head_num, input_layout, *, pse, padding_mask,
  atten_mask, softmax_max, softmax_sum, softmax_in, attention_in, scale_value, keep_prob, pre_tockens,
  next_tockens, inner_precise, seed, offset, numels, prefix, actual_seq_qlen, actual_seq_kvlen,
  sparse_mode, ...) -> (dq, dk, dv, dpse)`` recomputes the probabilities from the given
  ``softmax_max`` / ``softmax_sum`` and takes the forward output as ``attention_in`` (as MindSpeed's
  ring attention calls it with the merged statistics). Passing ``softmax_max = lse`` and
  ``softmax_sum = 1`` gives the probabilities ``exp(s - lse)`` of the global softmax.

These signatures (and the flash_attn ones of :mod:`mm_parallel.cuda_attention`) are pinned from the
packages' sources in ``libs/mm-parallel/tests/upstream_apis.py`` (torch_npu from Ascend/pytorch master,
where ``npu_fusion_attention`` also takes ``softmax_layout`` / ``sink`` and the grad returns five tensors);
the tests' stand-ins bind every call through them.

A block with a key padding mask gets a dense ``[B, 1, Sq, Sk]`` bool mask (the kernel takes no
broadcast key mask in the BSND layout); blocks without padding get none.

Packed (variable-length) blocks run in the ``TND`` layout: ``[T, N, D]`` with the batch rows' tokens
one after another, and ``actual_seq_qlen`` / ``actual_seq_kvlen`` the host lists of cumulative segment
ends WITHOUT the leading 0 (``cu_seqlens[1:]``, as MindSpeed's ``flash_attention_score(...,
input_layout="TND", actual_seq_qlen=cu_seqlens_q[1:].tolist())`` and the torch_npu docs). In TND the
softmax statistics have the shape ``[T, N, 8]`` but are stored segment by segment, each segment's
heads first: ``concat_i [N, len_i, 8]`` (MindSpeed ``mindspeed/core/context_parallel/utils.py``:
``flatten_softmax`` turns the kernel's statistics into token-major rows with exactly this reading
before its ring merge, and ``unflatten_softmax`` turns merged ones back before the grad).
:func:`tnd_rows` / :func:`tnd_stats` convert. This is the one part of the adapter read from a user of
the kernel rather than its reference page; the stand-in in the tests is written from the same
reading, so the first NPU run should check packed attention against the per-sample reference
(``test_packed_attention.py`` runs on any device).
"""

from __future__ import annotations

import math
from itertools import accumulate

import torch
from torch import Tensor

from mm_parallel.attention_masks import full_mask

LAYOUT = "BSND"
VARLEN_LAYOUT = "TND"
STATS_LAST_DIM = 8  # softmax_max / softmax_sum repeat each row's value 8 times
NO_MASK, LEFT_UP_CAUSAL = 0, 2  # sparse_mode values
_COMPRESSED_CAUSAL = 2048  # side of the mask sparse_mode 2 takes


def _scale(q: Tensor, scale: float | None) -> float:
    return scale if scale is not None else 1.0 / math.sqrt(q.size(-1))


def npu_mask(attn_mask: Tensor | None, causal: bool, q: Tensor, k: Tensor) -> tuple[Tensor | None, int]:
    """``(atten_mask, sparse_mode)`` for a block: no mask; the compressed causal mask; or a dense
    bool mask with True = masked out (from our True = attend convention)."""
    if attn_mask is None and not causal:
        return None, NO_MASK
    if attn_mask is None:
        side = _COMPRESSED_CAUSAL
        return torch.ones(side, side, dtype=torch.bool, device=q.device).triu(1), LEFT_UP_CAUSAL
    if attn_mask.dtype != torch.bool:
        raise ValueError(f"the npu backend takes bool masks (True = attend), got {attn_mask.dtype}")
    keep = full_mask(attn_mask, causal, q.size(1), k.size(1), q.device)
    while keep.dim() < 4:
        keep = keep[None]
    return (~keep).expand(keep.size(0), keep.size(1), q.size(1), k.size(1)).contiguous(), NO_MASK


def npu_forward(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, attn_mask: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """One block on ``npu_fusion_attention``; LSE from its softmax max and sum."""
    import torch_npu

    atten_mask, sparse_mode = npu_mask(attn_mask, causal, q, k)
    out, softmax_max, softmax_sum, *_ = torch_npu.npu_fusion_attention(
        q, k, v, q.size(2), LAYOUT, atten_mask=atten_mask, scale=_scale(q, scale), keep_prob=1.0,
        sparse_mode=sparse_mode,
    )  # fmt: skip
    lse = softmax_max[..., 0] + torch.log(softmax_sum[..., 0])  # [B, N, Sq]
    return out, lse.transpose(1, 2)


def npu_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, *, causal: bool = False,
    attn_mask: Tensor | None = None, scale: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Block gradients from the global ``out`` / ``lse``: ``softmax_max = lse``, ``softmax_sum = 1``."""
    import torch_npu

    atten_mask, sparse_mode = npu_mask(attn_mask, causal, q, k)
    # rows without any key (-inf) -> +inf, so exp(s - max) is 0 rather than NaN
    row_max = torch.where(torch.isneginf(lse), float("inf"), lse).to(torch.float32).transpose(1, 2)
    softmax_max = row_max[..., None].expand(*row_max.shape, STATS_LAST_DIM).contiguous()
    dq, dk, dv, *_ = torch_npu.npu_fusion_attention_grad(
        q, k, v, dout.to(q.dtype), q.size(2), LAYOUT, atten_mask=atten_mask, softmax_max=softmax_max,
        softmax_sum=torch.ones_like(softmax_max), attention_in=out.to(q.dtype), scale_value=_scale(q, scale),
        keep_prob=1.0, sparse_mode=sparse_mode,
    )  # fmt: skip
    return dq, dk, dv


# ---------------------------------------------------------------- packed (variable-length) blocks, TND


def _tokens(t: Tensor) -> Tensor:
    """``[B, T, N, D]`` -> ``[B * T, N, D]`` (TND: the batch rows' tokens one after another)."""
    return t.reshape(-1, *t.shape[2:])


def _cumulative(lengths: tuple[int, ...], batch: int) -> list[int]:
    """``actual_seq_qlen`` / ``actual_seq_kvlen``: cumulative segment ends over the batch rows, no leading 0."""
    return list(accumulate(lengths * batch))


def tnd_rows(stat: Tensor, lengths: list[int]) -> Tensor:
    """TND softmax statistic ``[T, N, 8]`` (stored ``concat_i [N, len_i, 8]``) -> token-major ``[T, N]``."""
    heads = stat.size(1)
    flat = stat[..., 0].reshape(-1)  # storage order; [..., 0] keeps it
    pieces, start = [], 0
    for n in lengths:
        pieces.append(flat.narrow(0, start * heads, n * heads).view(heads, n).t())
        start += n
    return torch.cat(pieces, 0)


def tnd_stats(rows: Tensor, lengths: list[int]) -> Tensor:
    """Token-major ``[T, N]`` float32 -> a TND softmax statistic ``[T, N, 8]`` stored ``concat_i [N, len_i, 8]``."""
    heads = rows.size(1)
    pieces, start = [], 0
    for n in lengths:
        pieces.append(rows.narrow(0, start, n).t().reshape(-1))
        start += n
    flat = torch.cat(pieces).view(-1, heads)
    return flat[..., None].expand(*flat.shape, STATS_LAST_DIM).contiguous()


def _segment_lengths(lengths: tuple[int, ...], batch: int) -> list[int]:
    return list(lengths * batch)


def npu_varlen_forward(
    q: Tensor, k: Tensor, v: Tensor, q_lengths: tuple[int, ...], k_lengths: tuple[int, ...], *, scale: float
) -> tuple[Tensor, Tensor]:
    """Segment pairs in one ``npu_fusion_attention`` call in TND layout; LSE from its softmax max and sum."""
    import torch_npu

    b = q.size(0)
    out, softmax_max, softmax_sum, *_ = torch_npu.npu_fusion_attention(
        _tokens(q), _tokens(k), _tokens(v), q.size(2), VARLEN_LAYOUT, scale=scale, keep_prob=1.0,
        actual_seq_qlen=_cumulative(q_lengths, b), actual_seq_kvlen=_cumulative(k_lengths, b), sparse_mode=NO_MASK,
    )  # fmt: skip
    segments = _segment_lengths(q_lengths, b)
    lse = tnd_rows(softmax_max, segments) + torch.log(tnd_rows(softmax_sum, segments))  # [B * T, N]
    return out.unflatten(0, (b, -1)), lse.unflatten(0, (b, -1))


def npu_varlen_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, q_lengths: tuple[int, ...],
    k_lengths: tuple[int, ...], *, scale: float,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Block gradients in TND from the global ``out`` / ``lse``: ``softmax_max = lse``, ``softmax_sum = 1``."""
    import torch_npu

    b = q.size(0)
    rows = torch.where(torch.isneginf(lse), float("inf"), lse).to(torch.float32).flatten(0, 1)  # [B * T, N]
    softmax_max = tnd_stats(rows, _segment_lengths(q_lengths, b))
    dq, dk, dv, *_ = torch_npu.npu_fusion_attention_grad(
        _tokens(q), _tokens(k), _tokens(v), _tokens(dout.to(q.dtype)), q.size(2), VARLEN_LAYOUT,
        softmax_max=softmax_max, softmax_sum=torch.ones_like(softmax_max), attention_in=_tokens(out.to(q.dtype)),
        scale_value=scale, keep_prob=1.0, actual_seq_qlen=_cumulative(q_lengths, b),
        actual_seq_kvlen=_cumulative(k_lengths, b), sparse_mode=NO_MASK,
    )  # fmt: skip
    return dq.unflatten(0, (b, -1)), dk.unflatten(0, (b, -1)), dv.unflatten(0, (b, -1))
