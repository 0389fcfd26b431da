"""The target device's attention kernel, standing in for torch's CPU flash kernel in the trace.

The planner traces on CPU fake tensors (a CPU-only torch build cannot run autograd on CUDA fake
tensors), where every attention call, whatever route it takes (``F.scaled_dot_product_attention``,
mm-parallel's Ulysses / ring kernels on ``cpu_flash``), reaches
``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward. Their fake kernels return
the outputs only, so two things come from the target kernel's model instead: the bytes it
allocates inside the call (:func:`mm_parallel.kernel_workspace_bytes`, tagged "attention kernel
workspace", allocated and freed around the call) and its FLOPs (torch's own SDPA formulas).

Which kernel the target runs: CUDA's flash kernel for half-precision calls without a mask (head
dim a multiple of 8 up to 256), its memory-efficient kernel otherwise (as torch's SDPA and
``mm_parallel.cuda_attention`` choose); ``npu`` on Ascend; on the CPU target the traced kernel itself
(``cpu_flash``, with its per-thread tiles).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from mm_parallel import BlockShape, kernel_workspace_bytes
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

from mm_trainer.planner.device_specs import DeviceSpec

aten = torch.ops.aten
FORWARD = aten._scaled_dot_product_flash_attention_for_cpu.default
BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
_HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class AttentionCall:
    """One traced attention kernel call as the target device would run it."""

    kernel: str
    backward: bool
    workspace: int
    flops: int


def attention_call(func: object, args: tuple, kwargs: dict, device: DeviceSpec) -> AttentionCall | None:
    """The target kernel's view of ``func(*args, **kwargs)``, or None when it is no CPU attention op.

    Arguments are in the CPU op's ``[B, H, S, D]`` layout: forward ``(q, k, v, dropout, causal, *,
    attn_mask, scale)``, backward ``(grad_out, q, k, v, out, lse, dropout, causal, *, attn_mask, scale)``.
    """
    if func is FORWARD:
        q, k, v = args[:3]
        backward = False
    elif func is BACKWARD:
        q, k, v = args[1:4]
        backward = True
    else:
        return None
    masked = kwargs.get("attn_mask") is not None
    kernel = target_kernel(device, q.dtype, q.size(-1), masked)
    b, h, sq, d = q.shape
    shape = BlockShape(batch=b, q_len=sq, k_len=k.size(2), heads=h, head_dim=d, dtype=q.dtype)
    threads = torch.get_num_threads() if kernel == "cpu_flash" else 1
    forward_bytes, backward_bytes = kernel_workspace_bytes(kernel, shape, threads=threads)
    if backward:
        flops = sdpa_backward_flop_count(tuple(q.shape), tuple(q.shape), tuple(k.shape), tuple(v.shape))
    else:
        flops = sdpa_flop_count(tuple(q.shape), tuple(k.shape), tuple(v.shape))
    return AttentionCall(kernel, backward, backward_bytes if backward else forward_bytes, int(flops))


def target_kernel(device: DeviceSpec, dtype: torch.dtype, head_dim: int, masked: bool) -> str:
    """The fused kernel the target runs for one attention call."""
    if device.device_type == "cuda":
        flash = dtype in _HALF and not masked and head_dim % 8 == 0 and head_dim <= 256
        return "flash" if flash else "efficient"
    return device.attention_kernel
