"""Ring-attention block kernels against the ``math`` reference on one device: one table.

1. ``block``: every ring kernel that runs here (CUDA: ``flash``, ``efficient``, ``flash_attn`` when
   installed; CPU: ``cpu_flash``) computes one block's output and LSE, then its gradients from that
   output and LSE, for float32 and bfloat16, causal or not, with and without padded keys (a
   ``[B, 1, 1, Sk]`` key mask: batch 1 loses its last quarter of keys). Reference: the ``math``
   kernel on float64 copies of the same inputs.
2. ``ring``: the ring's merge over simulated blocks on one device: ``P`` ranks' zigzag shares,
   every (rank, source) block of :func:`mm_parallel.ring.block_plan` cut to its real keys
   (``key_len``) and run through the ring's own ``forward_step`` / ``backward_step`` with the
   device's ``auto`` kernel; reference: ``math`` on the whole float64 sequence with the padded keys
   masked.

Errors are ``max |x - ref| / max |ref|`` per tensor; a row is ``ok`` under 5e-3 (float32) or 3e-2
(bfloat16). Exit status 1 if a row is not.

    python benchmarks/cp_kernel_check.py --device cuda          # on a GPU (part of device_check.sh)
    python benchmarks/cp_kernel_check.py --device cpu --small   # the dry run
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys

import torch
from mm_parallel import get_backend, local_token_indices, real_token_counts, resolve_attention_backend
from mm_parallel.attention_backends import AttentionBackend
from mm_parallel.ring import backward_step, block_plan, forward_step

TOLERANCE = {torch.float32: 5e-3, torch.bfloat16: 3e-2}
REFERENCE = get_backend("math")


def _error(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double(), ref.double()
    finite = torch.isfinite(ref)
    return ((got - ref).abs()[finite].max() / ref.abs()[finite].max().clamp_min(1e-12)).item()


def _inputs(
    batch: int, seq: int, heads: int, dim: int, dtype: torch.dtype, device: str
) -> list[torch.Tensor]:
    gen = torch.Generator(device).manual_seed(0)
    return [torch.randn(batch, seq, heads, dim, generator=gen, device=device, dtype=dtype) for _ in range(4)]


def _row(
    check: str, kernel: str, dtype: torch.dtype, causal: bool, padded: bool, errors: list[float]
) -> bool:
    ok = max(errors) < TOLERANCE[dtype]
    cells = " ".join(f"{e:9.2e}" for e in errors)
    print(
        f"{check:<6} {kernel:<11} {str(dtype)[6:]:<9} {causal!s:<6} {padded!s:<6} {cells}  {'ok' if ok else 'FAIL'}"
    )
    return ok


def block_check(
    kernel: AttentionBackend, dtype: torch.dtype, causal: bool, padded: bool, shape: tuple, device: str
) -> bool:
    q, k, v, dout = _inputs(*shape, dtype, device)
    mask = None
    if padded:
        valid = torch.ones(shape[0], shape[1], dtype=torch.bool, device=device)
        valid[1, 3 * shape[1] // 4 :] = False
        mask = valid[:, None, None, :]
    ref = [t.double() for t in (q, k, v, dout)]
    ref_out, ref_lse = REFERENCE.forward(*ref[:3], causal=causal, attn_mask=mask)
    ref_grads = REFERENCE.backward(ref[3], *ref[:3], ref_out, ref_lse, causal=causal, attn_mask=mask)
    out, lse = kernel.forward(q, k, v, causal=causal, attn_mask=mask)
    grads = kernel.backward(dout, q, k, v, out, lse, causal=causal, attn_mask=mask)
    errors = [
        _error(out, ref_out),
        _error(lse, ref_lse),
        *(_error(g, r) for g, r in zip(grads, ref_grads, strict=True)),
    ]
    return _row("block", kernel.name, dtype, causal, padded, errors)


def ring_check(
    kernel: AttentionBackend, dtype: torch.dtype, causal: bool, world: int, shape: tuple, device: str
) -> bool:
    """P ranks' blocks on one device, merged by the ring's own steps; keys past ``key_len`` are padding."""
    q, k, v, dout = _inputs(*shape, dtype, device)
    full, local, key_len = shape[1], shape[1] // world, shape[1] - 5
    scale, acc = 1 / math.sqrt(shape[3]), torch.float32
    index = [local_token_indices(full, r, world, "zigzag", device) for r in range(world)]
    qs, ks, vs, ds = ([t.index_select(1, i) for i in index] for t in (q, k, v, dout))
    real = real_token_counts(key_len, local, world, "zigzag")
    plans = {
        (r, s): block_plan(r, s, world, causal, "zigzag", local, real[s])
        for r in range(world)
        for s in range(world)
    }
    outs = [torch.zeros(t.shape, dtype=acc, device=device) for t in qs]
    lses = [torch.full(t.shape[:3], float("-inf"), dtype=acc, device=device) for t in qs]
    for (r, s), plan in plans.items():
        for block in plan:
            forward_step(qs[r], ks[s], vs[s], outs[r], lses[r], block, None, scale, kernel)
    grads = [[torch.zeros(t.shape, dtype=acc, device=device) for t in shares] for shares in (qs, ks, vs)]
    for (r, s), plan in plans.items():
        for block in plan:
            backward_step(ds[r], qs[r], ks[s], vs[s], outs[r].to(dtype), lses[r], grads[0][r], grads[1][s], grads[2][s],
                          block, None, scale, kernel)  # fmt: skip

    def assemble(parts: list[torch.Tensor]) -> torch.Tensor:
        whole = torch.empty(
            (parts[0].size(0), full, *parts[0].shape[2:]), dtype=parts[0].dtype, device=device
        )
        for i, part in zip(index, parts, strict=True):
            whole.index_copy_(1, i, part)
        return whole

    ref = [t.double() for t in (q, k, v, dout)]
    mask = (torch.arange(full, device=device) < key_len)[None, None, None, :]
    ref_out, ref_lse = REFERENCE.forward(*ref[:3], causal=causal, attn_mask=mask, scale=scale)
    ref_grads = REFERENCE.backward(
        ref[3], *ref[:3], ref_out, ref_lse, causal=causal, attn_mask=mask, scale=scale
    )
    got = [assemble(outs), assemble(lses), *(assemble(g) for g in grads)]
    errors = [_error(g, r) for g, r in zip(got, [ref_out, ref_lse, *ref_grads], strict=True)]
    return _row(f"ring{world}", kernel.name, dtype, causal, True, errors)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="the smallest shapes (a dry run)")
    args = parser.parse_args()
    device = args.device
    block_shape = (2, 64, 2, 32) if args.small else (2, 1024, 8, 128)
    ring_shape = (2, 64, 2, 32) if args.small else (1, 4096, 8, 128)
    ring_kernels = [n for n in ("cpu_flash", "flash", "efficient", "flash_attn", "npu") if _runs(n, device)]
    auto = get_backend(resolve_attention_backend("auto", device).backend)
    name = torch.cuda.get_device_name() if device == "cuda" else device
    print(
        f"torch {torch.__version__} on {name}: ring-attention kernels vs math (float64 reference), max|x - ref| / max|ref|"
    )
    print(
        f"{'check':<6} {'kernel':<11} {'dtype':<9} {'causal':<6} {'padded':<6} {'out':>9} {'lse':>9} {'dq':>9} {'dk':>9} {'dv':>9}"
    )
    ok = True
    for name, dtype, causal, padded in itertools.product(
        ring_kernels, TOLERANCE, (False, True), (False, True)
    ):
        ok &= block_check(get_backend(name), dtype, causal, padded, block_shape, device)
    for dtype, causal in itertools.product(TOLERANCE, (False, True)):
        ok &= ring_check(auto, dtype, causal, 4, ring_shape, device)
    return 0 if ok else 1


def _runs(name: str, device: str) -> bool:
    try:
        resolve_attention_backend(name, device)
    except (RuntimeError, ValueError):
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
