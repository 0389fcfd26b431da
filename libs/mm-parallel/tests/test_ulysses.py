"""Ulysses attention over real gloo groups equals single-process SDPA on the full sequence.

One process launch per world size runs every case and reports the max abs differences of the
output and the q/k/v gradients; the parametrized tests read those reports.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from mm_parallel import split_sequence, ulysses_attention

B, H, D = 2, 4, 8
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
# (dtype, causal, layout, mask): mask "none" | "padding" (key padding mask) | "full" (per-head [B,H,S,S])
CASES = [
    *itertools.product(
        (torch.float32, torch.float64), (False, True), ("contiguous",), ("none", "padding", "full")
    ),
    *itertools.product((torch.float32, torch.float64), (False,), ("zigzag",), ("none", "padding")),
]


def _case_id(case: tuple) -> str:
    dtype, causal, layout, mask = case
    return f"{str(dtype)[6:]}-{'causal' if causal else 'full'}-{layout}-{mask}"


def _inputs(dtype: torch.dtype, seq: int, mask: str) -> tuple:
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(B, seq, H, D, generator=gen, dtype=dtype) for _ in range(4))
    valid = torch.ones(B, seq, dtype=torch.bool)
    valid[1, seq // 2 - 1 :] = False
    full = (torch.rand(B, H, seq, seq, generator=gen) > 0.5) | torch.eye(seq, dtype=torch.bool)
    return q, k, v, dout, valid if mask == "padding" else None, full if mask == "full" else None


def _reference(q, k, v, dout, valid, full, causal: bool) -> list[torch.Tensor]:  # noqa: ANN001
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    mask = full if valid is None else valid[:, None, None, :]
    if causal:
        tril = torch.ones(q.size(1), q.size(1), dtype=torch.bool).tril()
        mask = tril if mask is None else mask & tril
    out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), attn_mask=mask).transpose(
        1, 2
    )
    out.backward(dout)
    return [out.detach(), q.grad, k.grad, v.grad]


def _ulysses_worker(rank: int, world: int) -> dict[str, float]:
    group = dist.new_group(list(range(world)))
    report = {}
    for case in CASES:
        dtype, causal, layout, mask = case
        q, k, v, dout, valid, full = _inputs(dtype, 4 * world, mask)
        expected = [
            split_sequence(t, 1, group, layout) for t in _reference(q, k, v, dout, valid, full, causal)
        ]
        local = [split_sequence(t, 1, group, layout).requires_grad_() for t in (q, k, v)]
        kpm = None if valid is None else split_sequence(valid, 1, group, layout)
        out = ulysses_attention(*local, group, attn_mask=full, key_padding_mask=kpm, causal=causal)
        out.backward(split_sequence(dout, 1, group, layout))
        got = [out.detach()] + [t.grad for t in local]
        report[_case_id(case)] = max((g - e).abs().max().item() for g, e in zip(got, expected, strict=True))
    return report


_REPORTS: dict[int, dict[str, float]] = {}


def _reports(distributed, world: int) -> dict[str, float]:  # noqa: ANN001
    if world not in _REPORTS:
        reports = distributed(_ulysses_worker, world)
        _REPORTS[world] = {key: max(r[key] for r in reports) for key in reports[0]}
    return _REPORTS[world]


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_ulysses_attention_matches_full_sdpa_outputs_and_grads(distributed, world: int, case: tuple) -> None:  # noqa: ANN001
    assert _reports(distributed, world)[_case_id(case)] < TOL[case[0]]


@pytest.mark.slow
def test_heads_not_divisible_by_group_size_raise_with_the_numbers(distributed) -> None:  # noqa: ANN001
    def worker(rank: int, world: int) -> str:
        q = torch.zeros(1, 2, 3, 8)
        with pytest.raises(ValueError) as err:
            ulysses_attention(q, q, q, dist.group.WORLD)
        return str(err.value)

    assert "3 attention heads are not divisible by the ulysses group size 2" in distributed(worker, 2)[0]


def test_ulysses_attention_without_group_is_plain_attention() -> None:
    q, k, v, _, _, _ = _inputs(torch.float64, 6, "none")
    expected = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
    torch.testing.assert_close(ulysses_attention(q, k, v, None, causal=True), expected.transpose(1, 2))


def test_custom_attn_fn_receives_full_sequence_and_kwargs() -> None:
    seen = {}

    def attn_fn(q, k, v, attn_mask=None, **kw):  # noqa: ANN001, ANN003, ANN202
        seen.update(shape=tuple(q.shape), mask=attn_mask, **kw)
        return q

    q = torch.randn(1, 4, 2, 8)
    assert torch.equal(ulysses_attention(q, q, q, None, attn_fn, scale=0.5), q)
    assert seen == {"shape": (1, 4, 2, 8), "mask": None, "scale": 0.5}
