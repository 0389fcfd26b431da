"""Padding given as a key count (``key_len``): blocks cut to their real keys, no mask, same numbers.

One 4-process gloo launch runs ring attention over 4 ranks, USP over Ulysses 2 x Ring 2 and a
cross-attention ring (queries and keys of different lengths) with ``key_len``, and compares
outputs and gradients with full SDPA under the equivalent key padding mask.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from mm_parallel import real_token_counts, ring_attention, split_for_usp, split_sequence, usp_attention
from mm_parallel.ring import block_plan
from torch.distributed.device_mesh import init_device_mesh

B, H, D = 2, 2, 8
FULL = 16  # padded length: 4 ranks x 4 local tokens (zigzag: 8 chunks of 2)
RING_CASES = list(
    itertools.product(("cpu_flash", "math"), ("contiguous", "zigzag"), (False, True), (16, 13, 5))
)
USP_CASES = list(itertools.product(("contiguous", "zigzag"), (False, True), (16, 11)))


def _reference(q, k, v, dout, key_len: int, causal: bool) -> list[torch.Tensor]:  # noqa: ANN001
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    mask = (torch.arange(k.size(1)) < key_len)[None, None, None, :]
    if causal:
        mask = mask & torch.ones(q.size(1), k.size(1), dtype=torch.bool).tril()
    out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), attn_mask=mask)
    out.transpose(1, 2).backward(dout)
    return [out.transpose(1, 2).detach(), q.grad, k.grad, v.grad]


def _inputs(q_len: int, k_len: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q, dout = (torch.randn(B, q_len, H, D, generator=gen, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(B, k_len, H, D, generator=gen, dtype=torch.float64) for _ in range(2))
    return [q, k, v, dout]


def _error(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max((g - w).abs().max().item() for g, w in zip(got, want, strict=True))


def _ring_case(group: dist.ProcessGroup, backend: str, layout: str, causal: bool, key_len: int) -> float:
    q, k, v, dout = _inputs(FULL, FULL)
    want = [split_sequence(t, 1, group, layout) for t in _reference(q, k, v, dout, key_len, causal)]
    local = [split_sequence(t, 1, group, layout).requires_grad_() for t in (q, k, v)]
    out = ring_attention(*local, group, causal, layout, key_len=key_len, backend=backend)
    out.backward(split_sequence(dout, 1, group, layout))
    return _error([out.detach()] + [t.grad for t in local], want)


def _usp_case(ug: dist.ProcessGroup, rg: dist.ProcessGroup, layout: str, causal: bool, key_len: int) -> float:
    q, k, v, dout = _inputs(FULL, FULL, seed=1)
    want = [split_for_usp(t, 1, ug, rg, layout) for t in _reference(q, k, v, dout, key_len, causal)]
    local = [split_for_usp(t, 1, ug, rg, layout).requires_grad_() for t in (q, k, v)]
    out = usp_attention(*local, ug, rg, causal, layout, key_len=key_len)
    out.backward(split_for_usp(dout, 1, ug, rg, layout))
    return _error([out.detach()] + [t.grad for t in local], want)


def _cross_case(group: dist.ProcessGroup) -> float:
    """Video-like queries (3 per rank) against audio-like keys (2 per rank, the last 3 padding)."""
    q, k, v, dout = _inputs(12, 8, seed=2)
    want = [split_sequence(t, 1, group) for t in _reference(q, k, v, dout, 5, causal=False)]
    local = [split_sequence(t, 1, group).requires_grad_() for t in (q, k, v)]
    out = ring_attention(*local, group, layout="contiguous", key_len=5)
    out.backward(split_sequence(dout, 1, group))
    return _error([out.detach()] + [t.grad for t in local], want)


def _worker(rank: int, world: int) -> dict[str, float]:
    group = dist.new_group(list(range(world)))
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("ring", "ulysses"))
    ug, rg = mesh.get_group("ulysses"), mesh.get_group("ring")
    report = {f"ring-{case}": _ring_case(group, *case) for case in RING_CASES}
    report |= {f"usp-{case}": _usp_case(ug, rg, *case) for case in USP_CASES}
    report["cross"] = _cross_case(group)
    return report


_REPORT: dict[str, float] = {}


def _report(distributed) -> dict[str, float]:  # noqa: ANN001
    if not _REPORT:
        reports = distributed(_worker, 4)
        _REPORT.update({key: max(r[key] for r in reports) for key in reports[0]})
    return _REPORT


@pytest.mark.slow
@pytest.mark.parametrize("case", RING_CASES, ids=str)
def test_ring_attention_with_key_len_matches_sdpa_with_the_key_padding_mask(distributed, case: tuple) -> None:  # noqa: ANN001
    assert _report(distributed)[f"ring-{case}"] < 1e-10


@pytest.mark.slow
@pytest.mark.parametrize("case", USP_CASES, ids=str)
def test_usp_attention_with_key_len_matches_sdpa_with_the_key_padding_mask(distributed, case: tuple) -> None:  # noqa: ANN001
    assert _report(distributed)[f"usp-{case}"] < 1e-10


@pytest.mark.slow
def test_ring_cross_attention_with_a_padded_key_stream_matches_sdpa(distributed) -> None:  # noqa: ANN001
    assert _report(distributed)["cross"] < 1e-10


def test_real_token_counts_follow_the_layout_of_an_end_padded_split() -> None:
    # 13 real of 16; zigzag over 4 ranks holds chunks (0, 7), (1, 6), (2, 5), (3, 4) of 2 tokens
    assert real_token_counts(13, 4, 4, "zigzag") == [2, 3, 4, 4]
    assert real_token_counts(13, 4, 4, "contiguous") == [4, 4, 4, 1]
    assert real_token_counts(5, 4, 4, "zigzag") == [2, 2, 1, 0]


def test_real_token_counts_refuse_more_real_tokens_than_the_padded_length() -> None:
    with pytest.raises(ValueError, match="17 real tokens do not fit .* 4 x 4 = 16"):
        real_token_counts(17, 4, 4)


def test_a_block_is_cut_to_its_real_keys_and_a_block_of_padding_is_skipped() -> None:
    assert block_plan(0, 1, 2, False, "zigzag", 8, real_keys=5) == [(slice(None), slice(0, 5), False)]
    assert block_plan(0, 1, 2, False, "zigzag", 8, real_keys=0) == []


def test_a_causal_diagonal_block_with_padding_becomes_a_causal_square_and_a_full_rectangle() -> None:
    assert block_plan(1, 1, 2, True, "zigzag", 8, real_keys=3) == [
        (slice(0, 3), slice(0, 3), True),
        (slice(3, None), slice(0, 3), False),
    ]
