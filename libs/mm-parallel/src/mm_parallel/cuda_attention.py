"""CUDA block kernels for ring attention: torch's own fused kernels, and ``flash_attn`` when installed.

Every function takes the ``[batch, seq, heads, head_dim]`` layout of :mod:`mm_parallel.attention_backends`.
A forward returns ``(out, lse)`` with ``lse`` ``[B, Sq, H]`` in float32; a backward takes the *global*
``out`` / ``lse`` of its query rows (the ring's merged ones, flash-attention style) and returns the
block's ``(dq, dk, dv)``. None of them allocates a ``[Sq, Sk]`` tensor.

- flash kernel (torch, FlashAttention-2): ``aten._scaled_dot_product_flash_attention`` and its
  backward; fp16 / bf16, head_dim a multiple of 8 up to 256, no mask. Forward allocates out + lse,
  backward dq, dk, dv and an fp32 dq accumulator.
- memory-efficient kernel (torch, cutlass): ``aten._scaled_dot_product_efficient_attention`` and its
  backward; fp32 / fp16 / bf16 and an additive attention bias. A key padding mask ``[B, 1, 1, Sk]``
  becomes a bias ``[B, 1, 1, Sk]`` expanded to ``[B, H, Sq, Sk]`` with zero strides over heads and
  queries, so it is never materialized; its row is padded to the kernel's 16-element alignment and
  sliced back, as torch's SDPA does. The kernel returns its LSE padded to a multiple of 32 rows
  (and reads it so in backward).
- ``flash_attn`` (the Dao package, >= 2.7): ``flash_attn_func`` forward and
  ``flash_attn_interface._flash_attn_backward``; blocks with a mask, and float32 inputs, run the
  memory-efficient kernel.

Packed (variable-length) blocks, ``[B, sum(lengths), H, D]`` with the batch rows flattened into one
token axis (``lengths`` repeated per row): ``flash`` runs torch's flash kernel with ``cum_seq_q`` /
``cum_seq_k`` (``aten._flash_attention_forward`` / ``_backward``, what torch's nested-tensor SDPA
calls), ``flash_attn`` runs ``flash_attn_varlen_func`` / ``_flash_attn_varlen_backward``; both return
the LSE as ``[H, total_q]`` float32. Inputs the flash kernels do not take (float32, an odd head_dim) run
the memory-efficient kernel once per segment pair.

Neither kernel takes dropout here (ring attention has none), so the RNG state tensors the backward
ops want are placeholders. Copies go through ``clone`` / ``add_`` onto zeros rather than
``contiguous()`` / ``copy_``, whose python bindings take a CUDA device guard: that keeps the module
runnable on CUDA fake tensors in a CPU-only torch build (the tests' way to run it without a GPU).
"""

from __future__ import annotations

import math
from itertools import accumulate

import torch
from torch import Tensor

from mm_parallel.attention_masks import additive_mask
from mm_parallel.packed_blocks import segmentwise_backward, segmentwise_forward

_HALF = (torch.float16, torch.bfloat16)
_FUSED_DTYPES = (*_HALF, torch.float32)
FLASH_ATTN_MIN_VERSION = (2, 7)


def _bhsd(t: Tensor) -> Tensor:
    """``[B, S, H, D]`` <-> ``[B, H, S, D]`` (a view: the kernels read strides)."""
    return t.transpose(1, 2)


def _scale(q: Tensor, scale: float | None) -> float:
    return scale if scale is not None else 1.0 / math.sqrt(q.size(-1))


def _check_dtype(q: Tensor) -> None:
    if q.dtype not in _FUSED_DTYPES:
        raise ValueError(
            f"torch's fused CUDA attention kernels take float16, bfloat16 or float32 inputs, got {q.dtype}; "
            "use parallel.attention_backend: math for this dtype"
        )


def flash_kernel_fits(q: Tensor, attn_mask: Tensor | None) -> bool:
    """Whether torch's flash kernel takes this block (half precision, head_dim % 8 == 0 and <= 256, no mask)."""
    return attn_mask is None and q.dtype in _HALF and q.size(-1) % 8 == 0 and q.size(-1) <= 256


def _placeholder_rng() -> Tensor:
    return torch.zeros((), dtype=torch.int64)  # dropout 0: unused; a 0-dim CPU tensor fits any device


def _global_lse(lse: Tensor) -> Tensor:
    """Global row LSE ``[B, S, H]`` -> kernel layout ``[B, H, S]`` float32; rows without any key
    (-inf) become +inf so the recomputed probabilities ``exp(s - lse)`` are 0, not NaN."""
    lse = torch.where(torch.isneginf(lse), float("inf"), lse)
    return lse.to(torch.float32).transpose(1, 2).clone(memory_format=torch.contiguous_format)


# ---------------------------------------------------------------- torch's flash kernel


def torch_flash_forward(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, attn_mask: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """One block on torch's flash kernel, or on the memory-efficient one when the flash kernel does
    not take it (a mask, float32, an odd head_dim)."""
    if not flash_kernel_fits(q, attn_mask):
        return efficient_forward(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)
    out, lse, *_ = torch.ops.aten._scaled_dot_product_flash_attention(
        _bhsd(q), _bhsd(k), _bhsd(v), 0.0, causal, False, scale=_scale(q, scale)
    )
    return _bhsd(out), lse.transpose(1, 2)


def torch_flash_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, *, causal: bool = False,
    attn_mask: Tensor | None = None, scale: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Block gradients from the global ``out`` / ``lse`` on the kernel :func:`torch_flash_forward` used."""
    if not flash_kernel_fits(q, attn_mask):
        return efficient_backward(dout, q, k, v, out, lse, causal=causal, attn_mask=attn_mask, scale=scale)
    rng = _placeholder_rng()
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
        _bhsd(dout.to(q.dtype)), _bhsd(q), _bhsd(k), _bhsd(v), _bhsd(out.to(q.dtype)), _global_lse(lse),
        None, None, q.size(1), k.size(1), 0.0, causal, rng, rng, scale=_scale(q, scale),
    )  # fmt: skip
    return _bhsd(dq), _bhsd(dk), _bhsd(dv)


# ---------------------------------------------------------------- torch's memory-efficient kernel


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def attention_bias(attn_mask: Tensor, q: Tensor, k: Tensor) -> Tensor:
    """``attn_mask`` (bool True = attend, or additive; broadcastable to ``[B, H, Sq, Sk]``) as the
    efficient kernel's bias: ``q.dtype``, last dim stored with 16-element alignment, broadcast dims
    expanded with stride 0 (a key mask ``[B, 1, 1, Sk]`` stays ``B x Sk`` elements)."""
    b, sq, h, _ = q.shape
    sk = k.size(1)
    mask = attn_mask
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    stored = torch.zeros((*mask.shape[:3], _round_up(sk, 16)), dtype=q.dtype, device=q.device).narrow(
        -1, 0, sk
    )
    stored.add_(additive_mask(mask.expand(*mask.shape[:3], sk), q.dtype))  # onto zeros: no copy_ (see below)
    return stored.expand(b, h, sq, sk)


def _padded_lse(lse: Tensor) -> Tensor:
    """Global LSE ``[B, S, H]`` -> the efficient kernel's ``[B, H, ceil(S / 32) * 32]`` float32."""
    rows = lse.size(1)
    padded = torch.zeros(
        (lse.size(0), lse.size(2), _round_up(rows, 32)), dtype=torch.float32, device=lse.device
    )
    padded.narrow(-1, 0, rows).add_(_global_lse(lse))
    return padded


def efficient_forward(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, attn_mask: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """One block on torch's memory-efficient kernel (a mask enters as a broadcast bias)."""
    _check_dtype(q)
    bias = None if attn_mask is None else attention_bias(attn_mask, q, k)
    out, lse, *_ = torch.ops.aten._scaled_dot_product_efficient_attention(
        _bhsd(q), _bhsd(k), _bhsd(v), bias, True, 0.0, causal, scale=_scale(q, scale)
    )
    return _bhsd(out), lse.narrow(-1, 0, q.size(1)).transpose(1, 2)


def efficient_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, *, causal: bool = False,
    attn_mask: Tensor | None = None, scale: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Block gradients from the global ``out`` / ``lse`` on torch's memory-efficient kernel."""
    _check_dtype(q)
    bias = None if attn_mask is None else attention_bias(attn_mask, q, k)
    rng = _placeholder_rng()
    dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
        _bhsd(dout.to(q.dtype)), _bhsd(q), _bhsd(k), _bhsd(v), bias, _bhsd(out.to(q.dtype)), _padded_lse(lse),
        rng, rng, 0.0, [True, True, True, False], causal, scale=_scale(q, scale),
    )  # fmt: skip
    return _bhsd(dq), _bhsd(dk), _bhsd(dv)


# ---------------------------------------------------------------- flash_attn (the Dao package)


def flash_attn_version_ok() -> bool:
    """Whether ``flash_attn`` imports and is new enough (>= 2.7: ``window_size_left/right`` arguments)."""
    try:
        import flash_attn
    except ImportError:
        return False
    version = tuple(int(p) for p in str(flash_attn.__version__).split(".")[:2] if p.isdigit())
    return version >= FLASH_ATTN_MIN_VERSION


def flash_attn_forward(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, attn_mask: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """One block on ``flash_attn.flash_attn_func``; a block with a mask (or float32 inputs, which
    flash_attn does not take) runs the efficient kernel."""
    if attn_mask is not None or q.dtype == torch.float32:
        return efficient_forward(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)
    from flash_attn import flash_attn_func

    out, lse, _ = flash_attn_func(
        q, k, v, softmax_scale=_scale(q, scale), causal=causal, return_attn_probs=True
    )
    return out, lse.transpose(1, 2)  # flash_attn's lse is [B, H, Sq]


def flash_attn_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, *, causal: bool = False,
    attn_mask: Tensor | None = None, scale: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Block gradients through ``flash_attn_interface._flash_attn_backward`` (writes dq, dk, dv)."""
    if attn_mask is not None or q.dtype == torch.float32:
        return efficient_backward(dout, q, k, v, out, lse, causal=causal, attn_mask=attn_mask, scale=scale)
    from flash_attn.flash_attn_interface import _flash_attn_backward

    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    _flash_attn_backward(
        dout=dout.to(q.dtype).contiguous(), q=q, k=k, v=v, out=out.to(q.dtype).contiguous(),
        softmax_lse=_global_lse(lse), dq=dq, dk=dk, dv=dv, dropout_p=0.0, softmax_scale=_scale(q, scale),
        causal=causal, window_size_left=-1, window_size_right=-1, softcap=0.0, alibi_slopes=None,
        deterministic=False, rng_state=None,
    )  # fmt: skip
    return dq, dk, dv


# ---------------------------------------------------------------- packed (variable-length) blocks


def _tokens(t: Tensor) -> Tensor:
    """``[B, T, H, D]`` -> ``[B * T, H, D]`` (the varlen kernels' layout; batch rows one after another)."""
    return t.reshape(-1, *t.shape[2:])


def _cu_seqlens(lengths: tuple[int, ...], batch: int, device: torch.device) -> Tensor:
    """int32 ``[0, l0, l0 + l1, ...]`` over the batch rows' segments, on ``device``."""
    return torch.tensor((0, *accumulate(lengths * batch)), dtype=torch.int32, device=device)


def _varlen_lse(lse: Tensor, batch: int) -> Tensor:
    """A varlen kernel's ``[H, B * T]`` LSE -> ``[B, T, H]``."""
    return lse.unflatten(1, (batch, -1)).permute(1, 2, 0)


def _kernel_varlen_lse(lse: Tensor) -> Tensor:
    """Global ``[B, T, H]`` LSE -> contiguous ``[H, B * T]`` float32 (-inf rows -> +inf: zero gradient)."""
    lse = torch.where(torch.isneginf(lse), float("inf"), lse).to(torch.float32)
    return lse.permute(2, 0, 1).flatten(1).clone(memory_format=torch.contiguous_format)


def torch_flash_varlen_forward(
    q: Tensor, k: Tensor, v: Tensor, q_lengths: tuple[int, ...], k_lengths: tuple[int, ...], *, scale: float
) -> tuple[Tensor, Tensor]:
    """Segment pairs in one call of torch's flash kernel (``cum_seq_q`` / ``cum_seq_k``); float32 and
    other inputs it does not take: the memory-efficient kernel per pair."""
    if not flash_kernel_fits(q, None):
        return segmentwise_forward(efficient_forward, q, k, v, q_lengths, k_lengths, scale=scale)
    b = q.size(0)
    out, lse, *_ = torch.ops.aten._flash_attention_forward(
        _tokens(q), _tokens(k), _tokens(v), _cu_seqlens(q_lengths, b, q.device), _cu_seqlens(k_lengths, b, q.device),
        max(q_lengths), max(k_lengths), 0.0, False, False, scale=scale,
    )  # fmt: skip
    return out.unflatten(0, (b, -1)), _varlen_lse(lse, b)


def torch_flash_varlen_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, q_lengths: tuple[int, ...],
    k_lengths: tuple[int, ...], *, scale: float,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Gradients of :func:`torch_flash_varlen_forward`'s block from the global ``out`` / ``lse``."""
    if not flash_kernel_fits(q, None):
        return segmentwise_backward(
            efficient_backward, dout, q, k, v, out, lse, q_lengths, k_lengths, scale=scale
        )
    b, rng = q.size(0), _placeholder_rng()
    dq, dk, dv = torch.ops.aten._flash_attention_backward(
        _tokens(dout.to(q.dtype)), _tokens(q), _tokens(k), _tokens(v), _tokens(out.to(q.dtype)),
        _kernel_varlen_lse(lse), _cu_seqlens(q_lengths, b, q.device), _cu_seqlens(k_lengths, b, q.device),
        max(q_lengths), max(k_lengths), 0.0, False, rng, rng, scale=scale,
    )  # fmt: skip
    return dq.unflatten(0, (b, -1)), dk.unflatten(0, (b, -1)), dv.unflatten(0, (b, -1))


def flash_attn_varlen_forward(
    q: Tensor, k: Tensor, v: Tensor, q_lengths: tuple[int, ...], k_lengths: tuple[int, ...], *, scale: float
) -> tuple[Tensor, Tensor]:
    """Segment pairs in one ``flash_attn.flash_attn_varlen_func`` call (float32: efficient kernel per pair)."""
    if q.dtype == torch.float32:
        return segmentwise_forward(efficient_forward, q, k, v, q_lengths, k_lengths, scale=scale)
    from flash_attn import flash_attn_varlen_func

    b = q.size(0)
    out, lse, _ = flash_attn_varlen_func(
        _tokens(q), _tokens(k), _tokens(v), _cu_seqlens(q_lengths, b, q.device), _cu_seqlens(k_lengths, b, q.device),
        max(q_lengths), max(k_lengths), softmax_scale=scale, causal=False, return_attn_probs=True,
    )  # fmt: skip
    return out.unflatten(0, (b, -1)), _varlen_lse(lse, b)


def flash_attn_varlen_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, q_lengths: tuple[int, ...],
    k_lengths: tuple[int, ...], *, scale: float,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Gradients through ``flash_attn_interface._flash_attn_varlen_backward`` (writes dq, dk, dv)."""
    if q.dtype == torch.float32:
        return segmentwise_backward(
            efficient_backward, dout, q, k, v, out, lse, q_lengths, k_lengths, scale=scale
        )
    from flash_attn.flash_attn_interface import _flash_attn_varlen_backward

    b = q.size(0)
    q3, k3, v3 = _tokens(q), _tokens(k), _tokens(v)
    dq, dk, dv = (torch.empty_like(t) for t in (q3, k3, v3))
    _flash_attn_varlen_backward(
        dout=_tokens(dout.to(q.dtype)).contiguous(), q=q3, k=k3, v=v3, out=_tokens(out.to(q.dtype)).contiguous(),
        softmax_lse=_kernel_varlen_lse(lse), dq=dq, dk=dk, dv=dv, cu_seqlens_q=_cu_seqlens(q_lengths, b, q.device),
        cu_seqlens_k=_cu_seqlens(k_lengths, b, q.device), max_seqlen_q=max(q_lengths), max_seqlen_k=max(k_lengths),
        dropout_p=0.0, softmax_scale=scale, causal=False, window_size_left=-1, window_size_right=-1, softcap=0.0,
        alibi_slopes=None, deterministic=False, rng_state=None,
    )  # fmt: skip
    return dq.unflatten(0, (b, -1)), dk.unflatten(0, (b, -1)), dv.unflatten(0, (b, -1))
