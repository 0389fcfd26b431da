"""Attention kernels behind one small interface, and plain (non-parallel) attention.

Every kernel takes the flash-attn layout ``[batch, seq, heads, head_dim]``. A backend's
``forward(q, k, v, *, causal, attn_mask, scale)`` returns ``(out, lse)`` where ``lse`` is the
per-row log-sum-exp ``[batch, seq, heads]`` (or ``None`` when the kernel cannot give it). Ring
attention merges blocks with the LSE, so it only runs its blocks on backends with
``returns_lse=True`` and a ``backward(dout, q, k, v, out, lse, ...)``, which computes one block's
gradients from the *global* ``out``/``lse`` (flash-attention style).

Masks (:mod:`mm_parallel.attention_masks`): ``attn_mask`` is a bool tensor broadcastable to
``[batch, heads, q_len, k_len]`` (True = attend, SDPA's convention) or an additive float mask.
``causal`` is top-left aligned.

Registered backends (``available_backends()`` lists those usable here; ``device_types`` says where
each runs, empty = anywhere):

- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention``; no LSE. Default for plain attention.
- ``cpu_flash`` (cpu): torch's CPU flash kernel (``aten._scaled_dot_product_flash_attention_for_cpu``),
  memory-efficient, LSE, block backward. Default ring kernel on CPU.
- ``flash`` (cuda): torch's flash kernel for blocks without a mask (fp16/bf16), its memory-efficient
  kernel for blocks with padded keys and for fp32 (:mod:`mm_parallel.cuda_attention`). Default on CUDA.
- ``efficient`` (cuda): torch's memory-efficient kernel for every block.
- ``flash_attn`` (cuda): the ``flash_attn`` package (>= 2.7) when installed; masked blocks on ``efficient``.
- ``npu`` (npu): ``torch_npu.npu_fusion_attention`` and its grad when importable
  (:mod:`mm_parallel.npu_attention`). Default on NPU.
- ``math``: reference einsum path on any device, computes in float32 (or float64 for float64
  inputs), LSE, block backward. Materializes ``[B, H, Sq, Sk]`` scores: never an accelerator default.

Packed (variable-length) attention runs several segment pairs per call on a kernel's
``varlen_forward`` / ``varlen_backward`` where it has them (``flash``: torch's flash kernel with
``cum_seq``; ``flash_attn``: ``flash_attn_varlen_func``; ``npu``: TND layout with ``actual_seq_qlen``),
and one dense call per segment pair on the others (:mod:`mm_parallel.packed_blocks`).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from mm_parallel import cuda_attention, npu_attention
from mm_parallel.attention_masks import additive_mask, combine_masks, full_mask, key_padding_to_attn_mask

ForwardFn = Callable[..., tuple[Tensor, Tensor | None]]
BackwardFn = Callable[..., tuple[Tensor, Tensor, Tensor]]
VarlenForwardFn = Callable[..., tuple[Tensor, Tensor]]
"""``(q, k, v, q_lengths, k_lengths, *, scale) -> (out, lse)``: ``[B, sum(lengths), H, D]`` tensors whose
rows / columns are tiled by paired segments (all lengths > 0; non-causal, no mask)."""
VarlenBackwardFn = Callable[..., tuple[Tensor, Tensor, Tensor]]
"""``(dout, q, k, v, out, lse, q_lengths, k_lengths, *, scale) -> (dq, dk, dv)`` from the global out / lse."""


@dataclass(frozen=True)
class AttentionBackend:
    """One attention kernel: its forward, optional block backward and capabilities."""

    name: str
    forward: ForwardFn
    returns_lse: bool
    supports_mask: bool
    is_available: Callable[[], bool]
    backward: BackwardFn | None = None
    device_types: tuple[str, ...] = ()
    """Device types the kernel runs on; empty = any."""
    summary: str = ""
    """One line on what runs, for the log line of the run's choice."""
    requires: str = ""
    """What makes it available, named when it is not (e.g. the extra to install)."""
    varlen_forward: VarlenForwardFn | None = None
    """Native variable-length forward (several segment pairs in one call, packed attention); None = one
    dense call per segment pair (:mod:`mm_parallel.packed_blocks`)."""
    varlen_backward: VarlenBackwardFn | None = None
    """The block backward of :attr:`varlen_forward`."""

    def runs_on(self, device_type: str) -> bool:
        """Whether the kernel runs on tensors of ``device_type``."""
        return not self.device_types or device_type in self.device_types


_REGISTRY: dict[str, AttentionBackend] = {}


def register_backend(backend: AttentionBackend) -> AttentionBackend:
    """Add (or replace) a backend in the registry, keyed by ``backend.name``."""
    _REGISTRY[backend.name] = backend
    return backend


def get_backend(name: str) -> AttentionBackend:
    """Return the registered backend ``name``; raise naming the known ones if unknown or unavailable."""
    if name not in _REGISTRY:
        raise KeyError(f"unknown attention backend {name!r}; registered: {sorted(_REGISTRY)}")
    backend = _REGISTRY[name]
    if not backend.is_available():
        needs = f" (needs {backend.requires})" if backend.requires else ""
        raise RuntimeError(
            f"attention backend {name!r} is not available here{needs}; available: {available_backends()}"
        )
    return backend


def available_backends() -> list[str]:
    """Names of the registered backends whose code is present in this process (torch ops, packages);
    ``get_backend(name).device_types`` says which devices each runs on."""
    return [name for name, b in _REGISTRY.items() if b.is_available()]


def ring_backend_names() -> list[str]:
    """Names of every registered backend that can run ring blocks (LSE + block backward), installed or not."""
    return [name for name, b in _REGISTRY.items() if b.returns_lse and b.backward is not None]


def lse_backends() -> list[str]:
    """Names of available backends that return the log-sum-exp (usable as ring-attention kernels)."""
    return [name for name in available_backends() if _REGISTRY[name].returns_lse]


# ---------------------------------------------------------------- math (reference)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _scores(q: Tensor, k: Tensor, scale: float, causal: bool, attn_mask: Tensor | None) -> Tensor:
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    mask = full_mask(attn_mask, causal, q.size(1), k.size(1), q.device)
    if mask is None:
        return s
    return (
        s.masked_fill(mask.logical_not(), float("-inf")) if mask.dtype == torch.bool else s + mask.to(s.dtype)
    )


def _math_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    attn_mask: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    cdt = _compute_dtype(q.dtype)
    q, k, v = q.to(cdt), k.to(cdt), v.to(cdt)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.size(-1))
    s = _scores(q, k, scale, causal, attn_mask)
    lse = torch.logsumexp(s, dim=-1)  # [B, H, Sq]; -inf for fully masked rows
    p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse).unsqueeze(-1))
    out = torch.einsum("bhqk,bkhd->bqhd", p, v)
    return out, lse.transpose(1, 2)


def _math_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    *,
    causal: bool = False,
    attn_mask: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    cdt = _compute_dtype(q.dtype)
    q, k, v, dout, out = (t.to(cdt) for t in (q, k, v, dout, out))
    scale = scale if scale is not None else 1.0 / math.sqrt(q.size(-1))
    s = _scores(q, k, scale, causal, attn_mask)
    lse_bhq = lse.to(cdt).transpose(1, 2)
    p = torch.exp(s - torch.where(torch.isinf(lse_bhq), float("inf"), lse_bhq).unsqueeze(-1))
    delta = (dout * out).sum(-1).transpose(1, 2)  # [B, H, Sq]
    dv = torch.einsum("bhqk,bqhd->bkhd", p, dout)
    ds = p * (torch.einsum("bqhd,bkhd->bhqk", dout, v) - delta.unsqueeze(-1))
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, k) * scale
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, q) * scale
    return dq, dk, dv


# ---------------------------------------------------------------- torch SDPA and its CPU flash kernel


def _sdpa_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    attn_mask: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, None]:
    q_, k_, v_ = (t.transpose(1, 2) for t in (q, k, v))
    if attn_mask is not None and causal:
        attn_mask, causal = full_mask(attn_mask, True, q.size(1), k.size(1), q.device), False
    out = F.scaled_dot_product_attention(q_, k_, v_, attn_mask=attn_mask, is_causal=causal, scale=scale)
    return out.transpose(1, 2), None


def _additive(attn_mask: Tensor | None, causal: bool, q: Tensor, k: Tensor) -> tuple[Tensor | None, bool]:
    if attn_mask is None:
        return None, causal
    return additive_mask(full_mask(attn_mask, causal, q.size(1), k.size(1), q.device), q.dtype), False


def _cpu_flash_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    attn_mask: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    mask, causal = _additive(attn_mask, causal, q, k)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 0.0, causal, attn_mask=mask, scale=scale
    )
    return out.transpose(1, 2), lse.transpose(1, 2)


def _cpu_flash_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    *,
    causal: bool = False,
    attn_mask: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    mask, causal = _additive(attn_mask, causal, q, k)
    lse = torch.where(torch.isneginf(lse), float("inf"), lse)  # rows with no key get zero gradient
    grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        *(t.to(q.dtype).transpose(1, 2) for t in (dout, q, k, v, out)),
        lse.to(_compute_dtype(q.dtype))
        .transpose(1, 2)
        .contiguous(),  # the kernel's LSE is float32 for half inputs
        0.0,
        causal,
        attn_mask=mask,
        scale=scale,
    )
    return tuple(g.transpose(1, 2) for g in grads)  # type: ignore[return-value]


def _has_cpu_flash() -> bool:
    return hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")


# ---------------------------------------------------------------- registry


def _importable(module: str) -> Callable[[], bool]:
    return lambda: importlib.util.find_spec(module) is not None


def _has_aten(op: str) -> Callable[[], bool]:
    return lambda: hasattr(torch.ops.aten, op)


_CUDA = ("cuda",)
register_backend(AttentionBackend("sdpa", _sdpa_forward, False, True, lambda: True, summary="torch SDPA"))
register_backend(
    AttentionBackend(
        "cpu_flash", _cpu_flash_forward, True, True, _has_cpu_flash, _cpu_flash_backward, ("cpu",),
        "torch's CPU flash kernel",
    )
)  # fmt: skip
register_backend(
    AttentionBackend(
        "flash", cuda_attention.torch_flash_forward, True, True, _has_aten("_scaled_dot_product_flash_attention"),
        cuda_attention.torch_flash_backward, _CUDA,
        "torch's flash kernel; its memory-efficient kernel for blocks with padded keys and for float32",
        varlen_forward=cuda_attention.torch_flash_varlen_forward,
        varlen_backward=cuda_attention.torch_flash_varlen_backward,
    )
)  # fmt: skip
register_backend(
    AttentionBackend(
        "efficient", cuda_attention.efficient_forward, True, True,
        _has_aten("_scaled_dot_product_efficient_attention"), cuda_attention.efficient_backward, _CUDA,
        "torch's memory-efficient kernel (padded keys as a broadcast bias)",
    )
)  # fmt: skip
register_backend(
    AttentionBackend(
        "flash_attn", cuda_attention.flash_attn_forward, True, True, cuda_attention.flash_attn_version_ok,
        cuda_attention.flash_attn_backward, _CUDA,
        "flash_attn's kernel; torch's memory-efficient kernel for blocks with padded keys",
        requires="flash_attn >= 2.7 on CUDA: pip install 'mm-parallel[flash-attn]'",
        varlen_forward=cuda_attention.flash_attn_varlen_forward,
        varlen_backward=cuda_attention.flash_attn_varlen_backward,
    )
)  # fmt: skip
register_backend(
    AttentionBackend(
        "npu", npu_attention.npu_forward, True, True, _importable("torch_npu"), npu_attention.npu_backward,
        ("npu",), "torch_npu.npu_fusion_attention and npu_fusion_attention_grad",
        requires="torch_npu on Ascend: pip install 'mm-parallel[npu]'",
        varlen_forward=npu_attention.npu_varlen_forward, varlen_backward=npu_attention.npu_varlen_backward,
    )
)  # fmt: skip
register_backend(
    AttentionBackend(
        "math", _math_forward, True, True, lambda: True, _math_backward,
        summary="reference einsum; materializes [B, H, Sq, Sk] float32 scores",
    )
)  # fmt: skip


# ---------------------------------------------------------------- plain attention


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    attn_mask: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
    backend: str = "sdpa",
) -> Tensor:
    """Plain attention on ``[batch, seq, heads, head_dim]`` tensors (autograd through the kernel).

    ``key_padding_mask`` is ``[batch, k_len]`` bool, True = real token.
    """
    mask = combine_masks(
        attn_mask, None if key_padding_mask is None else key_padding_to_attn_mask(key_padding_mask)
    )
    out, _ = get_backend(backend).forward(q, k, v, causal=causal, attn_mask=mask, scale=scale)
    return out.to(q.dtype)
