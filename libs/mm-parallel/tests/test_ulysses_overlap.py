"""Ulysses all-to-all overlap (``overlap_heads``) computes exactly what the synchronous path computes.

With ``G`` head groups every group's all-to-alls are started at once and each group's attention runs
while the others' are in flight; each head's attention is the same computation, so outputs and the
q, k, v gradients are bitwise equal to ``overlap_heads=1`` in float32. Two gloo ranks (one launch) run
Ulysses 2 with 2 and 4 head groups, with a key padding mask, causal, packed, and through
``SequenceParallelPlan(overlap_heads=...)``.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from mm_parallel import PackedSequence, SequenceParallelPlan, split_packed, split_sequence, ulysses_attention
from mm_parallel.ulysses import OVERLAP_HEADS_DEFAULT, resolve_overlap_heads

B, S, H, D = 2, 16, 8, 8
PACKED = PackedSequence((7, 9))
CASES = ("g2", "g4", "g2-padding-mask", "g2-causal", "g4-packed", "g2-plan")


def _run(case: str, group: dist.ProcessGroup, overlap: int) -> list[torch.Tensor]:
    """[out, dq, dk, dv] of one Ulysses call on this rank's shards (float32)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(B, S, H, D, generator=gen) for _ in range(4))
    if "packed" in case:
        split = lambda t: split_packed(t, 1, PACKED, group, None, "contiguous")  # noqa: E731
    else:
        split = lambda t: split_sequence(t, 1, group)  # noqa: E731
    local = [split(t).requires_grad_() for t in (q, k, v)]
    if "padding-mask" in case:
        valid = torch.ones(B, S, dtype=torch.bool)
        valid[1, 11:] = False
        out = ulysses_attention(*local, group, key_padding_mask=split(valid), overlap_heads=overlap)
    elif "causal" in case:
        out = ulysses_attention(*local, group, causal=True, overlap_heads=overlap)
    elif "packed" in case:
        out = ulysses_attention(*local, group, packed=PACKED, overlap_heads=overlap)
    elif "plan" in case:
        out = SequenceParallelPlan(group, None, overlap_heads=overlap).attention(*local)
    else:
        out = ulysses_attention(*local, group, overlap_heads=overlap)
    out.backward(split(dout))
    return [out.detach()] + [t.grad for t in local]


def _worker(rank: int, world: int) -> dict[str, bool]:
    group = dist.new_group(list(range(world)))
    report = {}
    for case in CASES:
        groups = int(case.split("-")[0][1:])
        synchronous, overlapped = _run(case, group, 1), _run(case, group, groups)
        report[case] = all(torch.equal(a, b) for a, b in zip(synchronous, overlapped, strict=True))
    return report


_REPORT: dict[str, bool] = {}


def _report(distributed) -> dict[str, bool]:  # noqa: ANN001
    if not _REPORT:
        reports = distributed(_worker, 2)
        _REPORT.update({case: all(r[case] for r in reports) for case in CASES})
    return _REPORT


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_ulysses_overlap_is_bitwise_the_synchronous_result_forward_and_backward(
    distributed, case: str
) -> None:  # noqa: ANN001
    assert _report(distributed)[case] is True


def test_explicit_overlap_heads_must_split_the_heads_over_the_group() -> None:
    assert resolve_overlap_heads(4, heads=8, world=2, device_type="cpu") == 4
    with pytest.raises(ValueError, match="heads must divide by overlap_heads x ulysses = 8"):
        resolve_overlap_heads(4, heads=12, world=2, device_type="cpu")
    with pytest.raises(ValueError, match="positive number of head groups"):
        resolve_overlap_heads(0, heads=8, world=2, device_type="cpu")


def test_default_overlap_heads_is_the_device_default_where_the_heads_divide(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setitem(OVERLAP_HEADS_DEFAULT, "cpu", 4)
    assert resolve_overlap_heads(None, heads=8, world=2, device_type="cpu") == 4
    assert resolve_overlap_heads(None, heads=12, world=2, device_type="cpu") == 1  # 12 % (4 x 2): off
    assert (
        resolve_overlap_heads(None, heads=8, world=1, device_type="cpu") == 1
    )  # no Ulysses: nothing to overlap
    assert resolve_overlap_heads(None, heads=8, world=2, device_type="xpu") == 1  # not measured: off
