"""The Ulysses all-to-all overlapped with the q/k/v projections computes exactly what the synchronous
path computes.

An attention layer projects q, k and v with its own Linear layers, normalises q and k over all heads
together (RMSNorm, as Wan2.2 and LTX-2 do) and rotates them per token (a RoPE-like rotation), then hands
the three projections to the attention as callables. With ``overlap_projections=True`` q's all-to-all
is in flight while k is projected, and so on; with ``False`` the three are projected first. In float64
the outputs, the input gradient and every parameter gradient are bitwise equal (the same operations
run). Ulysses 2 (plain, with 2 head groups, packed, through ``SequenceParallelPlan``) runs on two gloo
ranks in one launch; USP 2x2 (Ulysses 2 x Ring 2) on four.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from mm_parallel import PackedSequence, SequenceParallelPlan, split_for_usp, split_packed, usp_attention
from mm_parallel.ulysses import OVERLAP_PROJECTIONS_DEFAULT, resolve_overlap_projections
from torch import nn

B, S, H, D = 2, 16, 4, 4
PACKED = PackedSequence((7, 9))
ULYSSES_CASES = ("ulysses", "ulysses-heads2", "ulysses-packed", "ulysses-plan")


class Projections(nn.Module):
    """q, k, v projections of this rank's tokens: per-token RMSNorm over all heads, then a rotation."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(H * D, H * D, dtype=torch.float64) for _ in range(3))
        self.norm_q, self.norm_k = (nn.RMSNorm(H * D, dtype=torch.float64) for _ in range(2))

    def project(self, x: torch.Tensor, which: str, angle: torch.Tensor) -> torch.Tensor:
        y = getattr(self, which)(x)
        if which != "v":
            y = getattr(self, f"norm_{which}")(y)
            y = y * angle.cos() + y.roll(1, -1) * angle.sin()  # per token, like RoPE
        return y.unflatten(-1, (H, D))


def _run(case: str, groups: tuple, overlap: bool) -> list[torch.Tensor]:
    """[out, dx, every parameter gradient] of one call on this rank's shards (float64)."""
    ulysses, ring = groups
    torch.manual_seed(0)
    layer = Projections()
    gen = torch.Generator().manual_seed(1)
    x, dout = (
        torch.randn(B, S, H * D, generator=gen, dtype=torch.float64),
        torch.randn(B, S, H, D, generator=gen, dtype=torch.float64),
    )
    angle = torch.arange(S, dtype=torch.float64)[:, None] / S
    if "packed" in case:
        split = lambda t, dim=1: split_packed(t, dim, PACKED, ulysses, ring, "contiguous")  # noqa: E731
    else:
        split = lambda t, dim=1: split_for_usp(t, dim, ulysses, ring, "zigzag")  # noqa: E731
    local, local_angle = split(x).requires_grad_(), split(angle, 0)
    q, k, v = (lambda w=w: layer.project(local, w, local_angle) for w in "qkv")
    if "plan" in case:
        out = SequenceParallelPlan(ulysses, ring, "zigzag", overlap_projections=overlap).attention(q, k, v)
    else:
        out = usp_attention(
            q, k, v, ulysses, ring, layout="contiguous" if "packed" in case else "zigzag",
            packed=PACKED if "packed" in case else None, overlap_heads=2 if "heads2" in case else 1,
            overlap_projections=overlap,
        )  # fmt: skip
    out.backward(split(dout))
    return [out.detach(), local.grad, *(p.grad for p in layer.parameters())]


def _equal(case: str, groups: tuple) -> bool:
    synchronous, overlapped = _run(case, groups, False), _run(case, groups, True)
    return all(torch.equal(a, b) for a, b in zip(synchronous, overlapped, strict=True))


def _ulysses_worker(rank: int, world: int) -> dict[str, bool]:
    group = dist.new_group(list(range(world)))
    return {case: _equal(case, (group, None)) for case in ULYSSES_CASES}


def _usp_worker(rank: int, world: int) -> bool:
    ulysses = [dist.new_group(r) for r in ([0, 1], [2, 3])][rank // 2]
    ring = [dist.new_group(r) for r in ([0, 2], [1, 3])][rank % 2]
    return _equal("usp", (ulysses, ring))


_REPORT: dict[str, bool] = {}


def _report(distributed) -> dict[str, bool]:  # noqa: ANN001
    if not _REPORT:
        reports = distributed(_ulysses_worker, 2)
        _REPORT.update({case: all(r[case] for r in reports) for case in ULYSSES_CASES})
    return _REPORT


@pytest.mark.slow
@pytest.mark.parametrize("case", ULYSSES_CASES)
def test_projection_overlap_at_ulysses_2_is_bitwise_the_synchronous_result_forward_and_backward(
    distributed, case: str
) -> None:  # noqa: ANN001
    assert _report(distributed)[case] is True


@pytest.mark.slow
def test_projection_overlap_at_usp_2x2_is_bitwise_the_synchronous_result_forward_and_backward(
    distributed,
) -> None:  # noqa: ANN001
    assert distributed(_usp_worker, 4) == [True] * 4


def test_projection_overlap_defaults_to_the_device_default_and_never_runs_without_ulysses(
    monkeypatch,
) -> None:  # noqa: ANN001
    monkeypatch.setitem(OVERLAP_PROJECTIONS_DEFAULT, "cpu", True)
    assert resolve_overlap_projections(None, world=2, device_type="cpu") is True
    assert resolve_overlap_projections(False, world=2, device_type="cpu") is False
    assert resolve_overlap_projections(True, world=1, device_type="cpu") is False  # nothing to overlap
    assert resolve_overlap_projections(None, world=2, device_type="xpu") is False  # not measured: off
