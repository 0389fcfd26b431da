"""``SequenceParallelPlan`` in one process: with no groups it is the identity around plain attention.

The split / gather / valid mask / attention over real Ulysses x Ring groups are checked in the
4-process launch of ``test_usp.py`` (``plan-*`` reports).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from mm_parallel import PackedSequence, SequenceParallelPlan


def test_plan_without_groups_splits_nothing_and_has_size_one() -> None:
    plan = SequenceParallelPlan()
    x = torch.randn(2, 7, 3)
    assert (plan.size, plan.enabled, plan.multiple, plan.padded_length(7)) == (1, False, 1, 7)
    assert plan.split(x, 1) is x
    assert plan.key_len() is None
    assert plan.valid_mask().tolist() == [True] * 7


def test_plan_gather_cuts_to_the_requested_length() -> None:
    x = torch.randn(2, 8, 3)
    assert torch.equal(SequenceParallelPlan().gather(x, 1, 5), x[:, :5])


def test_plan_remembers_the_real_length_per_stream() -> None:
    plan = SequenceParallelPlan()
    plan.split(torch.zeros(1, 5, 2), 1, "video")
    plan.split(torch.zeros(1, 2, 9), 2, "audio")
    assert plan.lengths == {"video": 5, "audio": 9}


def test_plan_attention_without_groups_is_plain_attention() -> None:
    q, k, v = (torch.randn(1, 6, 2, 8, dtype=torch.float64) for _ in range(3))
    expected = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)
    torch.testing.assert_close(SequenceParallelPlan().attention(q, k, v), expected)


def test_plan_valid_mask_needs_a_split_stream() -> None:
    with pytest.raises(KeyError, match="stream 'audio' was not split yet"):
        SequenceParallelPlan().valid_mask("audio")


def test_plan_refuses_an_unknown_layout() -> None:
    with pytest.raises(ValueError, match="layout must be one of"):
        SequenceParallelPlan(layout="striped")  # type: ignore[arg-type]


def test_plan_keeps_a_packed_streams_samples_apart_without_groups() -> None:
    plan = SequenceParallelPlan()
    packed = PackedSequence((3, 5))
    plan.pack(packed)
    q, k, v = (torch.randn(1, 8, 2, 8, dtype=torch.float64) for _ in range(3))
    local = [plan.split(t, 1) for t in (q, k, v)]
    out = plan.gather(plan.attention(*local), 1, 8)
    expected = torch.cat(
        [
            F.scaled_dot_product_attention(*(t[:, a:b].transpose(1, 2) for t in (q, k, v))).transpose(1, 2)
            for a, b in ((0, 3), (3, 8))
        ],
        1,
    )
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    assert plan.packing() == packed and plan.local_segments() == (3, 0, 5, 0)
    assert plan.valid_mask().tolist() == [True] * 8


def test_plan_unpacks_a_stream_and_names_a_wrong_gather_length() -> None:
    plan = SequenceParallelPlan()
    plan.pack(PackedSequence((3, 5)), "video")
    with pytest.raises(ValueError, match="stream 'video' is packed to 8 tokens, asked for 7"):
        plan.gather(torch.zeros(1, 8), 1, 7, stream="video")
    plan.pack(None, "video")
    assert plan.packing("video") is None
    with pytest.raises(KeyError, match="stream 'video' is not packed"):
        plan.local_segments("video")
    with pytest.raises(TypeError, match="expected a PackedSequence"):
        plan.pack((3, 5))  # type: ignore[arg-type]


def test_plan_refuses_overlap_heads_below_one() -> None:
    with pytest.raises(ValueError, match="overlap_heads must be a positive number"):
        SequenceParallelPlan(overlap_heads=0)
