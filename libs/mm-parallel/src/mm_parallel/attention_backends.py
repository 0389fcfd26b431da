"""Attention kernels behind one small interface, and plain (non-parallel) attention.

Every kernel takes the flash-attn layout ``[batch, seq, heads, head_dim]``. A backend's
``forward(q, k, v, *, causal, attn_mask, scale)`` returns ``(out, lse)`` where ``lse`` is the
per-row log-sum-exp ``[batch, seq, heads]`` (or ``None`` when the kernel cannot give it). Ring
attention merges blocks with the LSE, so it only runs its blocks on backends with
``returns_lse=True``; ``backward(dout, q, k, v, out, lse, ...)`` computes one block's gradients
from the *global* ``out``/``lse`` (flash-attention style); a backend without it falls back to the
``math`` backward.

Masks: ``attn_mask`` is a bool tensor broadcastable to ``[batch, heads, q_len, k_len]`` (True =
attend, SDPA's convention) or an additive float mask. ``causal`` is top-left aligned.

Registered backends (``available_backends()`` lists those usable here):

- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention``; no LSE. Default for plain attention.
- ``cpu_flash``: torch's CPU flash kernel (``aten._scaled_dot_product_flash_attention_for_cpu``),
  memory-efficient, returns LSE, has a block backward. Default ring kernel on CPU.
- ``math``: reference einsum path on any device, computes in float32 (or float64 for float64
  inputs), returns LSE, has a block backward. Materializes ``[B, H, Sq, Sk]`` scores.
- ``flash_attn``: ``flash_attn.flash_attn_func`` (CUDA, when importable), returns LSE, no masks.
- ``npu_fusion_attention``: ``torch_npu.npu_fusion_attention`` (NPU, when importable), returns LSE.

The ``flash_attn`` and ``npu_fusion_attention`` adapters are not exercised by the CPU test-suite.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

ForwardFn = Callable[..., tuple[Tensor, Tensor | None]]
BackwardFn = Callable[..., tuple[Tensor, Tensor, Tensor]]


@dataclass(frozen=True)
class AttentionBackend:
    """One attention kernel: its forward, optional block backward and capabilities."""

    name: str
    forward: ForwardFn
    returns_lse: bool
    supports_mask: bool
    is_available: Callable[[], bool]
    backward: BackwardFn | None = None
    requires: str = ""  # what makes it available, named when it is not (e.g. the extra to install)


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
    """Names of the registered backends usable in this process."""
    return [name for name, b in _REGISTRY.items() if b.is_available()]


def lse_backends() -> list[str]:
    """Names of available backends that return the log-sum-exp (usable as ring-attention kernels)."""
    return [name for name in available_backends() if _REGISTRY[name].returns_lse]


def default_lse_backend(device: torch.device) -> str:
    """The LSE kernel ring attention uses by default on ``device``."""
    if device.type == "cuda" and _REGISTRY["flash_attn"].is_available():
        return "flash_attn"
    if device.type == "npu" and _REGISTRY["npu_fusion_attention"].is_available():
        return "npu_fusion_attention"
    if device.type == "cpu":
        return "cpu_flash"
    return "math"


# ---------------------------------------------------------------- masks


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


def _full_mask(
    attn_mask: Tensor | None, causal: bool, q_len: int, k_len: int, device: torch.device
) -> Tensor | None:
    return combine_masks(attn_mask, causal_mask(q_len, k_len, device) if causal else None)


# ---------------------------------------------------------------- math (reference)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _scores(q: Tensor, k: Tensor, scale: float, causal: bool, attn_mask: Tensor | None) -> Tensor:
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    mask = _full_mask(attn_mask, causal, q.size(1), k.size(1), q.device)
    if mask is None:
        return s
    return s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.to(s.dtype)


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
    p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
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
    p = torch.exp(s - torch.where(torch.isinf(lse_bhq), float("inf"), lse_bhq)[..., None])
    delta = (dout * out).sum(-1).transpose(1, 2)  # [B, H, Sq]
    dv = torch.einsum("bhqk,bqhd->bkhd", p, dout)
    ds = p * (torch.einsum("bqhd,bkhd->bhqk", dout, v) - delta[..., None])
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
        attn_mask, causal = _full_mask(attn_mask, True, q.size(1), k.size(1), q.device), False
    out = F.scaled_dot_product_attention(q_, k_, v_, attn_mask=attn_mask, is_causal=causal, scale=scale)
    return out.transpose(1, 2), None


def _additive(attn_mask: Tensor | None, causal: bool, q: Tensor, k: Tensor) -> tuple[Tensor | None, bool]:
    if attn_mask is None:
        return None, causal
    mask = _full_mask(attn_mask, causal, q.size(1), k.size(1), q.device)
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
    return mask.to(q.dtype), False


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
        lse.to(q.dtype).transpose(1, 2).contiguous(),
        0.0,
        causal,
        attn_mask=mask,
        scale=scale,
    )
    return tuple(g.transpose(1, 2) for g in grads)  # type: ignore[return-value]


def _has_cpu_flash() -> bool:
    return hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")


# ---------------------------------------------------------------- optional accelerator kernels


def _flash_attn_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    attn_mask: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    if attn_mask is not None:
        raise ValueError("flash_attn backend does not take attn_mask")
    from flash_attn import flash_attn_func

    out, lse, _ = flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, return_attn_probs=True)
    return out, lse.transpose(1, 2)  # flash-attn gives lse [B, H, S]


def _npu_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    attn_mask: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    import torch_npu

    mask = _full_mask(attn_mask, causal, q.size(1), k.size(1), q.device)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.size(-1))
    res = torch_npu.npu_fusion_attention(
        q, k, v, q.size(2), input_layout="BSND", atten_mask=None if mask is None else ~mask, scale=scale
    )
    out, softmax_max, softmax_sum = res[0], res[1], res[2]  # max/sum: [B, H, S, 8] (repeated)
    lse = softmax_max[..., 0] + torch.log(softmax_sum[..., 0])
    return out, lse.transpose(1, 2)


def _importable(module: str) -> Callable[[], bool]:
    return lambda: importlib.util.find_spec(module) is not None


register_backend(AttentionBackend("sdpa", _sdpa_forward, False, True, lambda: True))
register_backend(
    AttentionBackend("cpu_flash", _cpu_flash_forward, True, True, _has_cpu_flash, _cpu_flash_backward)
)
register_backend(AttentionBackend("math", _math_forward, True, True, lambda: True, _math_backward))
register_backend(
    AttentionBackend(
        "flash_attn", _flash_attn_forward, True, False, _importable("flash_attn"),
        requires="flash_attn on CUDA: pip install 'mm-parallel[flash-attn]'",
    )
)  # fmt: skip
register_backend(
    AttentionBackend(
        "npu_fusion_attention", _npu_forward, True, True, _importable("torch_npu"),
        requires="torch_npu on Ascend: pip install 'mm-parallel[npu]'",
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
