"""The packed micro-batches ``mm-train plan`` traces for ``data.packing`` (``mm_trainer.planner.packing``)."""

import pytest
from mm_trainer.planner.packing import samples_cap, worst_case_packs

TOKENS = {(9, 48, 48): 720, (9, 32, 64): 640, (5, 64, 32): 384, (1, 40, 32): 80}


def test_the_largest_pack_holds_the_most_tokens_in_the_fewest_samples_and_the_smallest_the_most_samples():
    largest, smallest = worst_case_packs(TOKENS, budget=1824, cap=7)
    assert (largest.kind, largest.tokens, largest.samples) == ("largest", 1824, 3)  # 720 + 720 + 384
    assert largest.describe() == "2 x 9x48x48 + 1 x 5x64x32: 1824 of 1824 tokens"
    # 7 samples (the cap), the smallest ones upgraded while tokens remain: 720 + 640 + 5 x 80
    assert (smallest.kind, smallest.tokens, smallest.samples) == ("smallest", 1760, 7)


def test_a_pack_with_no_more_samples_tokens_or_larger_sample_than_the_other_is_not_traced():
    assert [p.describe() for p in worst_case_packs({(1, 8, 8): 64}, budget=200, cap=8)] == [
        "3 x 1x8x8: 192 of 200 tokens"
    ]
    (only,) = worst_case_packs(TOKENS, budget=1824, cap=1)
    assert only.describe() == "1 x 9x48x48: 720 of 1824 tokens"


def test_a_micro_batch_holds_at_most_the_steps_samples_less_one_per_other_micro_batch():
    assert samples_cap(global_batch_size=8, dp_size=2, micro_batch_size=4) == 7  # 2 ranks x 1 micro-step
    assert samples_cap(global_batch_size=8, dp_size=2, micro_batch_size=1) == 1  # 8 micro-batches of 8


def test_a_shape_above_the_budget_is_refused_naming_it_and_its_tokens():
    with pytest.raises(ValueError, match=r"token_budget=700 is below .*'9x48x48': 720"):
        worst_case_packs(TOKENS, budget=700, cap=7)
