"""Packed sequences on one process: the samples' description, their split geometry over Ring x Ulysses
(host arithmetic), the segment-pair blocks, and packed attention against each sample alone.

The split over real gloo groups and the context-parallel attention are checked in ``test_packed_cp.py``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from mm_parallel import (
    PackedLayout,
    PackedSequence,
    gather_packed,
    packed_attention,
    ring_attention,
    split_packed,
    usp_attention,
)
from mm_parallel.packed_blocks import VarlenBlock, segment_blocks

PACKED = PackedSequence((13, 5, 22, 1))


def test_packed_sequence_reads_and_gives_cu_seqlens() -> None:
    assert PACKED.cu_seqlens().tolist() == [0, 13, 18, 40, 41]
    assert PackedSequence.from_cu_seqlens(torch.tensor([0, 13, 18, 40, 41])) == PACKED
    assert PackedSequence.from_lengths(torch.tensor([13, 5, 22, 1])) == PACKED
    assert (PACKED.total, PACKED.max_len, PACKED.offsets) == (41, 22, (0, 13, 18, 40))
    assert PACKED.segment_ids().tolist() == [0] * 13 + [1] * 5 + [2] * 22 + [3]


def test_packed_sequence_refuses_empty_samples_and_a_cu_seqlens_not_from_zero() -> None:
    with pytest.raises(ValueError, match=r"positive int length; \(index, length\): \[\(1, 0\)\]"):
        PackedSequence((3, 0, 2))
    with pytest.raises(ValueError, match="at least one sample"):
        PackedSequence(())
    with pytest.raises(ValueError, match="must start at 0"):
        PackedSequence.from_cu_seqlens([1, 4])


def test_pack_and_unpack_are_inverse() -> None:
    samples = [torch.randn(2, n, 3) for n in (4, 1, 6)]
    x, packed = PackedSequence.pack(samples, 1)
    assert packed.lengths == (4, 1, 6)
    assert all(torch.equal(a, b) for a, b in zip(packed.unpack(x, 1), samples, strict=True))
    with pytest.raises(ValueError, match="dim 1 has 10 tokens, the packed sequence 3 samples of 11 tokens"):
        packed.unpack(x[:, :10], 1)


@pytest.mark.parametrize(
    ("ring", "ulysses", "layout"), [(2, 1, "zigzag"), (2, 2, "zigzag"), (4, 1, "contiguous")]
)
def test_every_ring_rank_holds_an_equal_share_of_every_sample(ring: int, ulysses: int, layout: str) -> None:
    lay = PackedLayout(PACKED, ring, ulysses, layout)  # type: ignore[arg-type]
    shares = [lay.ring_segments(r) for r in range(ring)]
    for i, (real, padded) in enumerate(zip(PACKED.lengths, lay.padded_lengths, strict=True)):
        assert padded % lay.chunks == 0 and padded >= real
        assert sum(s[2 * i] for s in shares) == real  # the sample's real tokens, spread over the ranks
        assert {s[2 * i] + s[2 * i + 1] for s in shares} == {padded // ring}  # the same share on every rank
    assert lay.padded_total % (lay.chunks * ulysses) == 0


def test_without_a_ring_only_the_end_is_padded_for_ulysses() -> None:
    lay = PackedLayout(PACKED, 1, 4)
    assert lay.padded_lengths == (13, 5, 22, 4)  # 41 tokens -> 44, the last sample's padding
    assert lay.ring_segments(0) == (13, 0, 5, 0, 22, 0, 1, 3)
    assert lay.local_segments(0, 1) == (2, 0, 5, 0, 4, 0, 0, 0)  # tokens 11..21: end of 0, 1, start of 2


def test_sources_and_placement_are_inverse_and_pads_point_past_the_end() -> None:
    lay = PackedLayout(PACKED, 2, 2, "zigzag")
    assert torch.equal(lay.sources[lay.placement], torch.arange(PACKED.total))
    assert int((lay.sources == PACKED.total).sum()) == lay.padded_total - PACKED.total
    local = [lay.local_sources(r, u) for r in range(2) for u in range(2)]
    assert torch.equal(torch.cat(local), lay.sources)  # CP order: ring-major, then Ulysses


def test_segment_blocks_run_pairs_non_empty_on_both_sides() -> None:
    # pairs: (2,3) (2,1) (0,0) (1,2) (1,0) (3,6) (3,0): (0,0) does not break a run, (1,0) and (3,0) do
    blocks = segment_blocks((2, 2, 0, 1, 1, 3, 3), (3, 1, 0, 2, 0, 6, 0))
    assert blocks == [
        VarlenBlock(slice(0, 5), slice(0, 6), (2, 2, 1), (3, 1, 2)),
        VarlenBlock(slice(6, 9), slice(6, 12), (3,), (6,)),
    ]
    with pytest.raises(ValueError, match="3 query segments, 2 key segments"):
        segment_blocks((1, 1, 1), (1, 1))


def _each_sample_alone(q, k, v, dout, q_lengths, k_lengths) -> list[torch.Tensor]:  # noqa: ANN001
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    q_parts = leaves[0].split(q_lengths, 1)
    k_parts, v_parts = leaves[1].split(k_lengths, 1), leaves[2].split(k_lengths, 1)
    outs = [
        F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in trio)).transpose(1, 2)
        if trio[1].size(1)
        else torch.zeros_like(trio[0])
        for trio in zip(q_parts, k_parts, v_parts, strict=True)
    ]
    out = torch.cat(outs, 1)
    out.backward(dout)
    return [out.detach()] + [t.grad for t in leaves]


@pytest.mark.parametrize("backend", ["cpu_flash", "math"])
def test_packed_attention_equals_each_sample_alone_forward_and_backward(backend: str) -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(2, PACKED.total, 4, 8, generator=gen, dtype=torch.float64) for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = packed_attention(*leaves, PACKED, backend=backend)
    out.backward(dout)
    expected = _each_sample_alone(q, k, v, dout, PACKED.lengths, PACKED.lengths)
    for got, want in zip([out.detach()] + [t.grad for t in leaves], expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_packed_cross_attention_pairs_segments_and_a_segment_without_keys_gets_zeros() -> None:
    q_lengths, k_lengths = (
        (3, 2, 4),
        (5, 0, 2),
    )  # e.g. each sample's tokens to its own text; sample 1 has none
    gen = torch.Generator().manual_seed(1)
    q, dout = (torch.randn(1, 9, 2, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(1, 7, 2, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = packed_attention(*leaves, q_lengths, k_lengths)
    out.backward(dout)
    expected = _each_sample_alone(q, k, v, dout, q_lengths, k_lengths)
    for got, want in zip([out.detach()] + [t.grad for t in leaves], expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert not out[:, 3:5].any()


def test_packed_attention_refuses_segments_that_do_not_cover_the_tokens() -> None:
    q = torch.randn(1, 10, 2, 8)
    with pytest.raises(ValueError, match="the queries hold 10 tokens, their segments"):
        packed_attention(q, q, q, (4, 5))


def test_packed_context_parallel_attention_is_non_causal_and_takes_no_key_mask() -> None:
    q = torch.randn(1, PACKED.total, 2, 8)
    with pytest.raises(ValueError, match="packed attention is non-causal and takes no key_padding_mask"):
        usp_attention(q, q, q, None, None, causal=True, packed=PACKED)
    with pytest.raises(ValueError, match="packed attention is non-causal and takes no key_padding_mask"):
        ring_attention(q, q, q, None, key_len=40, packed=PACKED)


def test_split_and_gather_without_groups_are_the_identity() -> None:
    x = torch.randn(2, PACKED.total, 3)
    assert split_packed(x, 1, PACKED) is x
    assert gather_packed(x, 1, PACKED) is x
    with pytest.raises(ValueError, match="split_packed: dim 1 has 40 tokens"):
        split_packed(x[:, :40], 1, PACKED)
