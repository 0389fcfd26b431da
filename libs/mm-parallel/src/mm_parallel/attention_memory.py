"""How many bytes one ring-attention block step allocates, computed from shapes.

The model behind ``benchmarks/cp_memory.py`` and the warning of :mod:`mm_parallel.attention_choice`.
A block step is what :func:`mm_parallel.ring.forward_step` / :func:`~mm_parallel.ring.backward_step`
do for one (query, key) block: the kernel call, then the online-softmax merge into the running
output (forward) or the accumulation of the block's gradients (backward). Its peak above what the
ring already holds (inputs, the running out / lse, the gradient accumulators, the KV in flight) is
the larger of two phases:

- kernel phase: the kernel's outputs and its own workspace (per backend, below);
- ring phase: forward, the block output and LSE, the block output cast to the accumulation dtype
  (float32 for half inputs) and 4 row-sized ``[B, Sq, H]`` temporaries of the merge; backward, the
  three gradients and, for half inputs, one float32 copy of the largest while it is added in.

Kernel terms (``S`` = one ``[B, H, Sq, Sk]`` score tensor in the compute dtype, rows = ``B Sq H``):

- ``math`` (measured): forward 3 S at once (scores, shifted scores, probabilities), backward
  4 S (scores, probabilities, dP - delta, dS) plus dv and delta; float32 copies of half inputs.
- ``cpu_flash`` (torch's CPU kernel source, ``FlashAttentionKernel.cpp``): per thread a
  ``q_split x kv_split`` float32 tile (forward 1, backward 2; 256/64/32 query rows for
  ``Sq >= 768 / >= 192 / else``, 512 keys) plus a reduced-precision copy for half inputs; where the
  CPU has AMX tiles for the half dtype (bfloat16: AMX-BF16; float16: AMX-FP16) the forward also packs
  K and V whole (``2 K`` bytes) with a ``kv_split x D`` copy buffer per thread (measured on torch 2.13).
- ``flash`` (FlashAttention-2 inside torch, ``flash_api.cpp`` ``mha_bwd``): forward out + LSE;
  backward dq, dk, dv, a float32 dq accumulator ``[B, ceil128(Sq), H, ceil32(D)]`` and
  ``softmax_d`` ``[B, H, ceil128(Sq)]``. float32 inputs run the efficient kernel.
- ``efficient`` (torch's cutlass kernel): LSE rows padded to a multiple of 32; backward a float32
  dq accumulator and delta.
- ``npu``: ``softmax_max`` / ``softmax_sum`` ``[B, H, Sq, 8]`` float32 each way.

``math`` and ``cpu_flash`` are checked against measured allocations by ``cp_memory.py --validate``;
the accelerator terms come from the kernel sources named above (a GPU run of ``cp_memory.py``
measures ``flash`` and ``efficient``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KERNELS = ("math", "cpu_flash", "flash", "efficient", "npu")
_HALF = (torch.float16, torch.bfloat16)


def _ceil(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class BlockShape:
    """One ring block: queries ``[batch, q_len, heads, head_dim]`` against ``k_len`` keys."""

    batch: int
    q_len: int
    k_len: int
    heads: int
    head_dim: int
    dtype: torch.dtype = torch.bfloat16

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def acc(self) -> int:
        """Bytes of the accumulation dtype (float32, float64 for float64 inputs)."""
        return torch.promote_types(self.dtype, torch.float32).itemsize

    @property
    def q_elems(self) -> int:
        return self.batch * self.q_len * self.heads * self.head_dim

    @property
    def k_elems(self) -> int:
        return self.batch * self.k_len * self.heads * self.head_dim

    @property
    def rows(self) -> int:
        return self.batch * self.q_len * self.heads

    @property
    def half(self) -> bool:
        return self.dtype in _HALF


def math_score_bytes(batch: int, heads: int, q_len: int, k_len: int, dtype: torch.dtype) -> int:
    """Bytes of one ``[B, H, Sq, Sk]`` score tensor of the ``math`` kernel (float32 or float64)."""
    return batch * heads * q_len * k_len * torch.promote_types(dtype, torch.float32).itemsize


def _cpu_splits(s: BlockShape) -> tuple[int, int]:
    q_split = 256 if s.q_len >= 768 else 64 if s.q_len >= 192 else 32
    return min(q_split, s.q_len), min(512, s.k_len)


def cpu_packs_half(dtype: torch.dtype) -> bool:
    """Whether torch's CPU flash kernel packs K and V for ``dtype`` on this CPU (AMX tiles for it)."""
    if dtype == torch.bfloat16:
        return torch.cpu._is_amx_tile_supported()
    return dtype == torch.float16 and torch.cpu._is_amx_fp16_supported()


def _cpu_flash_forward_workspace(s: BlockShape, threads: int) -> int:
    """Bytes the CPU flash forward allocates beyond its out and LSE: the per-thread tiles and, where
    the CPU packs the half dtype, the packed K and V and a copy buffer per thread."""
    qs, ks = _cpu_splits(s)
    tiles = threads * (s.acc * (qs * ks + 2 * qs + qs * s.head_dim) + (s.itemsize * qs * ks if s.half else 0))
    if s.half and cpu_packs_half(s.dtype):
        tiles += s.itemsize * (2 * s.k_elems + threads * ks * s.head_dim)
    return tiles


def _forward_kernel(kernel: str, s: BlockShape, threads: int) -> tuple[int, int]:
    """(kernel-phase bytes, bytes of its out + lse) of one block forward."""
    out = s.itemsize * s.q_elems
    if kernel == "math":
        score = math_score_bytes(s.batch, s.heads, s.q_len, s.k_len, s.dtype)
        casts = s.acc * (s.q_elems + 2 * s.k_elems) if s.acc != s.itemsize else 0
        return 3 * score + s.acc * s.rows + casts, s.acc * (s.q_elems + s.rows)
    if kernel == "cpu_flash":
        return out + s.acc * s.rows + _cpu_flash_forward_workspace(s, threads), out + s.acc * s.rows
    if kernel == "flash" and s.half:
        return out + 4 * s.rows, out + 4 * s.rows
    if kernel in ("flash", "efficient"):
        lse = 4 * s.batch * s.heads * _ceil(s.q_len, 32)
        return out + lse, out + lse
    if kernel == "npu":
        stats = 2 * 4 * 8 * s.rows
        return out + stats, out + stats
    raise ValueError(f"no memory model for kernel {kernel!r}; modelled: {KERNELS}")


def _backward_kernel(kernel: str, s: BlockShape, threads: int) -> tuple[int, int]:
    """(kernel-phase bytes, bytes of the three gradients it returns) of one block backward."""
    grads = s.itemsize * (s.q_elems + 2 * s.k_elems)
    lse_prep = s.acc * s.rows + 4 * s.rows  # rows without keys -> +inf, then [B, H, Sq] contiguous
    if kernel == "math":
        score = math_score_bytes(s.batch, s.heads, s.q_len, s.k_len, s.dtype)
        casts = s.acc * (3 * s.q_elems + 2 * s.k_elems) if s.acc != s.itemsize else 0
        return 4 * score + s.acc * (s.k_elems + s.rows) + casts, s.acc * (s.q_elems + 2 * s.k_elems)
    if kernel == "cpu_flash":
        qs, ks = _cpu_splits(s)
        tiles = threads * (s.acc * (2 * qs * ks + qs) + (s.itemsize * 2 * qs * ks if s.half else 0))
        return grads + tiles + 2 * s.acc * s.rows, grads
    if kernel == "flash" and s.half:
        q_rounded = _ceil(s.q_len, 128)
        dq_accum = 4 * s.batch * q_rounded * s.heads * _ceil(s.head_dim, 32)
        return grads + dq_accum + 4 * s.batch * s.heads * q_rounded + lse_prep, grads
    if kernel in ("flash", "efficient"):
        padded_rows = 4 * s.batch * s.heads * _ceil(s.q_len, 32)
        return grads + 4 * s.q_elems + 2 * padded_rows + lse_prep, grads
    if kernel == "npu":
        return grads + 2 * 4 * 8 * s.rows + s.acc * s.rows, grads
    raise ValueError(f"no memory model for kernel {kernel!r}; modelled: {KERNELS}")


def block_step_bytes(kernel: str, shape: BlockShape, *, threads: int = 1) -> tuple[int, int]:
    """Peak bytes one ring block step allocates: ``(forward, backward)``.

    ``threads``: intra-op threads (only ``cpu_flash`` keeps per-thread tiles).
    """
    s = shape
    kernel_fwd, outputs = _forward_kernel(kernel, s, threads)
    out_cast = s.acc * s.q_elems if s.half and kernel != "math" else 0
    merge = outputs + out_cast + 4 * s.acc * s.rows
    kernel_bwd, grads = _backward_kernel(kernel, s, threads)
    largest = max(s.q_elems, s.k_elems)
    accumulate = grads + (s.acc * largest if s.half and kernel != "math" else 0)
    return max(kernel_fwd, merge), max(kernel_bwd, accumulate)


def kernel_workspace_bytes(kernel: str, shape: BlockShape, *, threads: int = 1) -> tuple[int, int]:
    """Bytes one kernel call allocates *inside* the kernel, beyond the tensors it returns:
    ``(forward, backward)``.

    What a trace of the surrounding code cannot see (the planner traces torch's CPU flash kernel on
    fake tensors, which shows its outputs only, and adds this for the target kernel). The terms are
    those of :func:`block_step_bytes`'s kernel phases (same sources), less the returned outputs and
    the LSE preparation the callers do in Python:

    - ``math``: the score tensors (3 S forward, 4 S backward), float32 copies of half inputs, the
      row statistics and ``dv`` / ``delta`` of its backward;
    - ``cpu_flash``: the per-thread tiles;
    - ``flash`` (half): nothing forward; backward the float32 dq accumulator and ``softmax_d``;
    - ``flash`` (float32) / ``efficient``: the LSE's padding to 32 rows forward; backward a float32
      dq accumulator and two padded row vectors;
    - ``npu``: ``softmax_max`` / ``softmax_sum`` ``[B, H, Sq, 8]`` float32 beyond the returned LSE
      forward; backward the two of them again and a row vector.
    """
    s = shape
    if kernel == "math":
        score = math_score_bytes(s.batch, s.heads, s.q_len, s.k_len, s.dtype)
        half_casts = s.acc != s.itemsize
        fwd_casts = s.acc * (s.q_elems + 2 * s.k_elems) if half_casts else 0
        bwd_casts = s.acc * (3 * s.q_elems + 2 * s.k_elems) if half_casts else 0
        return 3 * score + s.acc * s.rows + fwd_casts, 4 * score + s.acc * (s.k_elems + s.rows) + bwd_casts
    if kernel == "cpu_flash":
        qs, ks = _cpu_splits(s)
        forward = _cpu_flash_forward_workspace(s, threads)
        backward = threads * (s.acc * (2 * qs * ks + qs) + (s.itemsize * 2 * qs * ks if s.half else 0))
        return forward, backward
    if kernel == "flash" and s.half:
        q_rounded = _ceil(s.q_len, 128)
        dq_accum = 4 * s.batch * q_rounded * s.heads * _ceil(s.head_dim, 32)
        return 0, dq_accum + 4 * s.batch * s.heads * q_rounded
    if kernel in ("flash", "efficient"):
        padded_rows = 4 * s.batch * s.heads * _ceil(s.q_len, 32)
        return padded_rows - 4 * s.rows, 4 * s.q_elems + 2 * padded_rows
    if kernel == "npu":
        stats = 2 * 4 * 8 * s.rows
        return stats - 4 * s.rows, stats + s.acc * s.rows
    raise ValueError(f"no memory model for kernel {kernel!r}; modelled: {KERNELS}")
