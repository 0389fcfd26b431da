"""Ring attention over real gloo groups equals single-process SDPA on the full sequence.

One process launch per world size runs every case (dtype x causal x layout x padding x kernel)
and reports the max abs differences; the parametrized tests below read those reports.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from mm_parallel import ring_attention, split_sequence
from mm_parallel.ring import block_plan

B, H, D = 2, 4, 8
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
CASES = [
    (dtype, causal, layout, padded, backend)
    for dtype, causal, layout, padded in itertools.product(
        (torch.float32, torch.float64), (False, True), ("contiguous", "zigzag"), (False, True)
    )
    for backend in ("cpu_flash", "math")
]


def _case_id(case: tuple) -> str:
    dtype, causal, layout, padded, backend = case
    return (
        f"{str(dtype)[6:]}-{'causal' if causal else 'full'}-{layout}-{'pad' if padded else 'nopad'}-{backend}"
    )


def _inputs(dtype: torch.dtype, seq: int, padded: bool) -> tuple[torch.Tensor, ...]:
    """Full q, k, v, dout and a key padding mask: batch 1 keeps only its first ``seq//2 - 1`` tokens,
    so whole KV blocks are padding on some ranks."""
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(B, seq, H, D, generator=gen, dtype=dtype) for _ in range(4))
    valid = torch.ones(B, seq, dtype=torch.bool)
    if padded:
        valid[1, seq // 2 - 1 :] = False
    return q, k, v, dout, valid


def _reference(q, k, v, dout, valid, causal: bool) -> list[torch.Tensor]:  # noqa: ANN001
    """torch SDPA on the full sequence: [out, dq, dk, dv]."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    mask = (
        valid[:, None, None, :] & torch.ones(q.size(1), q.size(1), dtype=torch.bool).tril()
        if causal
        else None
    )
    mask = valid[:, None, None, :] if mask is None else mask
    out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), attn_mask=mask).transpose(
        1, 2
    )
    out.backward(dout)
    return [out.detach(), q.grad, k.grad, v.grad]


def _ring_worker(rank: int, world: int) -> dict[str, float]:
    group = dist.new_group(list(range(world)))
    report = {}
    for case in CASES:
        dtype, causal, layout, padded, backend = case
        seq = 8 * world
        q, k, v, dout, valid = _inputs(dtype, seq, padded)
        expected = [split_sequence(t, 1, group, layout) for t in _reference(q, k, v, dout, valid, causal)]
        local = [split_sequence(t, 1, group, layout).requires_grad_() for t in (q, k, v)]
        out = ring_attention(
            *local,
            group,
            causal=causal,
            layout=layout,
            key_padding_mask=split_sequence(valid, 1, group, layout) if padded else None,
            backend=backend,
        )
        out.backward(split_sequence(dout, 1, group, layout))
        got = [out.detach()] + [t.grad for t in local]
        report[_case_id(case)] = max((g - e).abs().max().item() for g, e in zip(got, expected, strict=True))
    return report


_REPORTS: dict[int, dict[str, float]] = {}


def _reports(distributed, world: int) -> dict[str, float]:  # noqa: ANN001
    """Max over ranks of every case's error; one process launch per world size."""
    if world not in _REPORTS:
        reports = distributed(_ring_worker, world)
        _REPORTS[world] = {key: max(r[key] for r in reports) for key in reports[0]}
    return _REPORTS[world]


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_ring_attention_matches_full_sdpa_outputs_and_grads(distributed, world: int, case: tuple) -> None:  # noqa: ANN001
    assert _reports(distributed, world)[_case_id(case)] < TOL[case[0]]


def test_zigzag_causal_plan_gives_every_rank_the_same_work() -> None:
    world, local_len = 4, 8

    def work(rank: int) -> int:
        total = 0
        for src in range(world):
            for rows, cols, _ in block_plan(rank, src, world, True, "zigzag", local_len):
                total += len(range(local_len)[rows]) * len(range(local_len)[cols])
        return total

    assert len({work(r) for r in range(world)}) == 1


def test_contiguous_causal_plan_skips_blocks_from_later_ranks() -> None:
    assert block_plan(0, 1, 2, True, "contiguous", 4) == []
    assert block_plan(1, 0, 2, True, "contiguous", 4) == [(slice(None), slice(None), False)]


def test_ring_attention_without_group_is_plain_attention() -> None:
    q, k, v, _, _ = _inputs(torch.float64, 6, False)
    expected = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
    torch.testing.assert_close(ring_attention(q, k, v, None, causal=True), expected.transpose(1, 2))


def _cross_worker(rank: int, world: int, backend: str, padded: bool) -> float:
    """Video-like queries (12 per rank) against audio-like keys (4 per rank, the last ones padding)."""
    group = dist.new_group(list(range(world)))
    gen = torch.Generator().manual_seed(3)
    q, dout = (torch.randn(B, 12 * world, H, D, generator=gen, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(B, 4 * world, H, D, generator=gen, dtype=torch.float64) for _ in range(2))
    valid = torch.ones(B, 4 * world, dtype=torch.bool)
    if padded:
        valid[:, -3:] = False
    q_ref, k_ref, v_ref = (t.clone().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(
        *(t.transpose(1, 2) for t in (q_ref, k_ref, v_ref)), attn_mask=valid[:, None, None, :]
    ).transpose(1, 2)
    ref.backward(dout)
    want = [ref.detach(), q_ref.grad, k_ref.grad, v_ref.grad]
    split = [split_sequence(t, 1, group, "contiguous") for t in want]
    local = [split_sequence(t, 1, group, "contiguous").requires_grad_() for t in (q, k, v)]
    mask = split_sequence(valid, 1, group, "contiguous") if padded else None
    out = ring_attention(*local, group, layout="contiguous", key_padding_mask=mask, backend=backend)
    out.backward(split_sequence(dout, 1, group, "contiguous"))
    got = [out.detach()] + [t.grad for t in local]
    return max((g - e).abs().max().item() for g, e in zip(got, split, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("padded", [False, True], ids=["nopad", "pad"])
@pytest.mark.parametrize("backend", ["cpu_flash", "math"])
def test_ring_cross_attention_with_queries_and_keys_of_different_lengths_matches_sdpa(
    distributed, backend: str, padded: bool
) -> None:  # noqa: ANN001
    assert max(distributed(_cross_worker, 2, backend, padded)) < 1e-10


def test_ring_attention_rejects_mismatched_heads() -> None:
    q = torch.zeros(1, 4, 2, 8)
    with pytest.raises(ValueError, match="one batch, heads and head_dim"):
        ring_attention(q, q[:, :, :1], q[:, :, :1], None)


def test_causal_ring_attention_rejects_queries_and_keys_of_different_lengths() -> None:
    q = torch.zeros(1, 4, 2, 8)
    with pytest.raises(ValueError, match="one length"):
        ring_attention(q, q[:, :2], q[:, :2], None, causal=True)
