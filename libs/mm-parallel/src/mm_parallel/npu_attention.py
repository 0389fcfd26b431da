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
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mm_parallel.attention_masks import full_mask

LAYOUT = "BSND"
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
    softmax_max = row_max[..., None].expand(*row_max.shape, 8).contiguous()
    dq, dk, dv, *_ = torch_npu.npu_fusion_attention_grad(
        q, k, v, dout.to(q.dtype), q.size(2), LAYOUT, atten_mask=atten_mask, softmax_max=softmax_max,
        softmax_sum=torch.ones_like(softmax_max), attention_in=out.to(q.dtype), scale_value=_scale(q, scale),
        keep_prob=1.0, sparse_mode=sparse_mode,
    )  # fmt: skip
    return dq, dk, dv
