"""Attention masks in one convention: bool True = attend (SDPA's), or an additive float mask.

Kernels with other conventions convert at their edge (``torch_npu`` takes True = masked out; the
CUDA memory-efficient kernel takes an additive bias). ``causal`` is top-left aligned everywhere.
"""

from __future__ import annotations

import torch
from torch import Tensor


def causal_mask(q_len: int, k_len: int, device: torch.device) -> Tensor:
    """Top-left aligned causal mask ``[q_len, k_len]`` (True = attend)."""
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril()


def key_padding_to_attn_mask(key_padding_mask: Tensor) -> Tensor:
    """``[batch, k_len]`` bool (True = real token) -> attention mask ``[batch, 1, 1, k_len]``."""
    if key_padding_mask.dtype != torch.bool or key_padding_mask.dim() != 2:
        raise ValueError(
            f"key_padding_mask must be a bool tensor [batch, seq] (True = real token), "
            f"got dtype {key_padding_mask.dtype} shape {tuple(key_padding_mask.shape)}"
        )
    return key_padding_mask[:, None, None, :]


def key_length_mask(batch: int, length: int, key_len: int, device: torch.device) -> Tensor:
    """``[batch, length]`` bool key padding mask whose first ``key_len`` keys are real."""
    return (torch.arange(length, device=device) < key_len).expand(batch, length)


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """AND bool masks / add float masks (a bool mask turns masked entries of a float one to -inf)."""
    out: Tensor | None = None
    for m in masks:
        if m is None:
            continue
        if out is None:
            out = m
        elif out.dtype == torch.bool and m.dtype == torch.bool:
            out = out & m
        elif m.dtype == torch.bool:
            out = out.masked_fill(~m, float("-inf"))
        elif out.dtype == torch.bool:
            out = m.masked_fill(~out, float("-inf"))
        else:
            out = out + m
    return out


def full_mask(
    attn_mask: Tensor | None, causal: bool, q_len: int, k_len: int, device: torch.device
) -> Tensor | None:
    """``attn_mask`` combined with the causal mask when ``causal`` (None when neither is given)."""
    return combine_masks(attn_mask, causal_mask(q_len, k_len, device) if causal else None)


def additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A bool (True = attend) or float mask as an additive float mask of ``dtype`` (same shape)."""
    if mask.dtype != torch.bool:
        return mask.to(dtype)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
        mask.logical_not(), float("-inf")
    )
