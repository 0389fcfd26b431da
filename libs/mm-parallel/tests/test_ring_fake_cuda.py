"""Ring attention's CUDA path without a GPU: CUDA fake tensors at the A14B per-rank shape.

Under ``FakeTensorMode`` every tensor is a CUDA fake (shapes, no data) and torch's fused kernels
run their fake (meta) implementations, so the whole ring forward and backward pass executes, with
its point-to-point exchange over a real 2-rank gloo group (collectives on fake tensors move no
data). A dispatch mode records every op and the storage of every tensor it creates. Autograd
cannot record CUDA tensors in a CPU-only torch build (no CUDA device guard), so the test drives
the ring's two passes (``ring_forward``, ``ring_backward``) directly, as its autograd Function does.

Shape: Wan2.2 A14B on Ulysses 4 x Ring 2 (32,760 tokens padded to 32,768): 16,384 ring-local
tokens and 10 heads of 128 per rank in bf16; one ``[B, H, Sq, Sk]`` score tensor would be
16384 x 16384 x 10 elements. Packed cases: three samples of 20,000, 9,000 and 3,755 tokens (32,755,
each padded for the zigzag ring) on the same ranks, through torch's varlen flash kernel (bf16) or the
memory-efficient kernel once per segment pair (fp32).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from mm_parallel import PackedLayout, PackedSequence
from mm_parallel.ring import plan_packed_ring_pass, plan_ring_pass, ring_backward, ring_forward
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

S, H, D = 16384, 10, 128
SCORE_ELEMENTS = S * S * H
CASES = {  # name -> (dtype, causal, padding: None | "key_len" | "mask", backend)
    "bf16-full": (torch.bfloat16, False, None, None),
    "bf16-full-key_len-padded": (torch.bfloat16, False, "key_len", None),
    "bf16-causal-key_len-padded": (torch.bfloat16, True, "key_len", None),
    "bf16-full-key-padding-mask": (torch.bfloat16, False, "mask", None),
    "fp32-full": (torch.float32, False, None, None),
    "bf16-full-math (control)": (torch.bfloat16, False, None, "math"),
    "bf16-packed": (torch.bfloat16, False, "packed", None),
    "fp32-packed": (torch.float32, False, "packed", None),
}
PACKED = PackedLayout(PackedSequence((20000, 9000, 3755)), ring=2, layout="zigzag")


class AllocationRecorder(TorchDispatchMode):
    """Every op name, and the largest storage (bytes) among the tensors ops return."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        self.ops.add(func.__name__.split(".")[0])
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.untyped_storage().nbytes())
        return out


def _case(
    group: dist.ProcessGroup, dtype: torch.dtype, causal: bool, padding: str | None, backend: str | None
):  # noqa: ANN202
    with FakeTensorMode():
        local = PACKED.ring_local_len if padding == "packed" else S
        q, k, v, dout = (torch.empty(1, local, H, D, device="cuda", dtype=dtype) for _ in range(4))
        mask = torch.ones(1, S, dtype=torch.bool, device="cuda") if padding == "mask" else None
        key_len = 2 * S - 8 if padding == "key_len" else None
        if padding == "packed":
            ring = plan_packed_ring_pass(q, k, group, PACKED, PACKED, 1 / math.sqrt(D), backend)
        else:
            ring = plan_ring_pass(q, k, group, causal, "zigzag", mask, key_len, 1 / math.sqrt(D), backend)
        with AllocationRecorder() as recorder:
            out, lse = ring_forward(q, k, v, ring)
            grads = ring_backward(dout, q, k, v, out, lse, ring)
    return {
        "kernel": ring.kernel.name,
        "largest": recorder.largest,
        "ops": recorder.ops,
        "shapes": [tuple(t.shape) for t in (out, lse, *grads)],
    }


def _worker(rank: int, world: int) -> dict[str, dict]:
    group = dist.new_group(list(range(world)))
    return {name: _case(group, *case) for name, case in CASES.items()}


_REPORT: dict[str, dict] = {}


def _report(distributed) -> dict[str, dict]:  # noqa: ANN001
    if not _REPORT:
        _REPORT.update(distributed(_worker, 2)[0])
    return _REPORT


FUSED = [name for name in CASES if "control" not in name]


@pytest.mark.slow
@pytest.mark.parametrize("name", FUSED)
def test_cuda_ring_pass_allocates_no_score_sized_tensor(distributed, name: str) -> None:  # noqa: ANN001
    report = _report(distributed)[name]
    assert report["largest"] < SCORE_ELEMENTS, f"{report['largest']:,} bytes >= {SCORE_ELEMENTS:,}"


@pytest.mark.slow
@pytest.mark.parametrize("name", FUSED)
def test_cuda_ring_pass_auto_selects_torch_flash_not_math(distributed, name: str) -> None:  # noqa: ANN001
    assert _report(distributed)[name]["kernel"] == "flash"


@pytest.mark.slow
def test_cuda_ring_blocks_without_padded_keys_run_the_flash_kernel_both_ways(distributed) -> None:  # noqa: ANN001
    for name in ("bf16-full", "bf16-full-key_len-padded", "bf16-causal-key_len-padded"):
        ops = _report(distributed)[name]["ops"]
        assert {"_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward"} <= ops
        assert not {o for o in ops if "efficient" in o}, name


@pytest.mark.slow
def test_cuda_packed_ring_blocks_run_torchs_varlen_flash_kernel_in_bf16_and_efficient_in_fp32(
    distributed,
) -> None:  # noqa: ANN001
    bf16, fp32 = _report(distributed)["bf16-packed"]["ops"], _report(distributed)["fp32-packed"]["ops"]
    assert {"_flash_attention_forward", "_flash_attention_backward"} <= bf16  # cum_seq_q / cum_seq_k
    assert not {o for o in bf16 if "efficient" in o}
    assert {
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_efficient_attention_backward",
    } <= fp32
    assert not {o for o in fp32 if o.startswith("_flash_attention")}


@pytest.mark.slow
def test_cuda_ring_key_padding_mask_and_fp32_run_the_memory_efficient_kernel(distributed) -> None:  # noqa: ANN001
    for name in ("bf16-full-key-padding-mask", "fp32-full"):
        ops = _report(distributed)[name]["ops"]
        assert {
            "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_efficient_attention_backward",
        } <= ops
        assert "_scaled_dot_product_flash_attention" not in ops, name


@pytest.mark.slow
def test_cuda_ring_pass_returns_output_lse_and_gradients_of_the_local_shapes(distributed) -> None:  # noqa: ANN001
    assert _report(distributed)["bf16-full"]["shapes"] == [(1, S, H, D), (1, S, H), *[(1, S, H, D)] * 3]
    local = PACKED.ring_local_len
    assert _report(distributed)["bf16-packed"]["shapes"] == [
        (1, local, H, D),
        (1, local, H),
        *[(1, local, H, D)] * 3,
    ]


@pytest.mark.slow
def test_the_recorder_sees_the_score_tensors_of_the_math_kernel(distributed) -> None:  # noqa: ANN001
    # the control: the same harness on the math kernel records a [B, H, Sq, Sk] float32 tensor
    assert _report(distributed)["bf16-full-math (control)"]["largest"] >= 4 * SCORE_ELEMENTS
