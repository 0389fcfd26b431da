import itertools

import numpy as np
import pytest
import torch
from mm_data import (
    TokenBalancedSampler,
    TokenBudgetError,
    build_packed_dataloader,
    check_token_budget,
    patch_tokens,
    plan_step,
    token_imbalance,
)

GBS, SEED, BUDGET = 32, 3, 16384


def mixed_tokens(n: int = 200) -> list[int]:
    """Wan-style latents (VAE stride 4x8x8, patch 1x2x2): three resolutions x three lengths, plus images."""
    rng = np.random.default_rng(0)
    sizes = [(256, 256), (272, 480), (352, 640)]
    frames = [1, 17, 33, 49]  # 1 = an image
    tokens = []
    for _ in range(n):
        h, w = sizes[rng.integers(len(sizes))]
        f = frames[rng.integers(len(frames))]
        tokens.append(patch_tokens((f - 1) // 4 + 1, h // 8, w // 8))
    return tokens


TOKENS = mixed_tokens()


def sampler(dp_rank: int, dp_size: int, tokens=TOKENS, **kw) -> TokenBalancedSampler:
    kw = {"global_batch_size": GBS, "token_budget": BUDGET, "seed": SEED, **kw}
    return TokenBalancedSampler(tokens, dp_rank=dp_rank, dp_size=dp_size, **kw)


def epoch_steps(dp_size: int, **kw) -> list[list[list[list[int]]]]:
    """Per global step, per dp rank: that rank's micro-batches, read by iterating every rank's sampler."""
    ranks = [sampler(r, dp_size, **kw) for r in range(dp_size)]
    per_rank = [list(s) for s in ranks]
    steps, pos = [], [0] * dp_size
    for step in range(ranks[0].steps_per_epoch):
        k = ranks[0].micro_steps_at(0, step)
        steps.append([per_rank[r][pos[r] : pos[r] + k] for r in range(dp_size)])
        pos = [p + k for p in pos]
    assert pos == [len(b) for b in per_rank]
    return steps


def test_the_plan_is_a_function_of_step_data_and_seed():
    a, b = sampler(1, 4), sampler(1, 4)
    assert list(a) == list(b)
    assert list(sampler(1, 4, seed=SEED + 1)) != list(a)


def test_every_sample_of_the_epoch_is_used_once():
    steps = epoch_steps(4)
    used = [i for ranks in steps for batches in ranks for batch in batches for i in batch]
    assert sorted(used) == sorted(sampler(0, 4).epoch_order(0)[: len(steps) * GBS])
    assert len(used) == len(set(used)) == (len(TOKENS) // GBS) * GBS


@pytest.mark.parametrize("dp_size", [2, 4])
def test_ranks_get_balanced_tokens_on_a_mixed_shape_set(dp_size):
    for ranks in epoch_steps(dp_size):
        loads = [sum(TOKENS[i] for batch in batches for i in batch) for batches in ranks]
        assert token_imbalance(loads) <= 0.10, loads
        for micro in zip(*ranks, strict=True):  # every micro-step's packed sequences, within budget
            assert all(sum(TOKENS[i] for i in batch) <= BUDGET for batch in micro)


@pytest.mark.parametrize("dp_size", [2, 4])
def test_the_mixed_set_is_imbalanced_when_split_by_sample_count(dp_size):
    """The balance above is the assignment's: the same steps sliced by count (as GlobalOrderSampler
    slices a global batch) leave a rank over 10% above the mean."""
    s, per_rank = sampler(0, dp_size), GBS // dp_size
    worst = max(
        token_imbalance(
            [sum(TOKENS[i] for i in samples[r * per_rank : (r + 1) * per_rank]) for r in range(dp_size)]
        )
        for samples in (s.step_samples(0, step) for step in range(s.steps_per_epoch))
    )
    assert worst > 0.10


def test_global_step_sample_sets_are_the_same_at_dp_1_2_4():
    sets = {
        dp: [{i for batches in ranks for batch in batches for i in batch} for ranks in epoch_steps(dp)]
        for dp in (1, 2, 4)
    }
    assert sets[1] == sets[2] == sets[4]
    assert sets[1][0] == set(sampler(0, 1).step_samples(0, 0))


def test_sample_ids_are_layout_free():
    def ids(dp_size):
        out = {}
        for r in range(dp_size):
            s = sampler(r, dp_size)
            for step in range(2):
                for m in range(s.micro_steps_at(0, step)):
                    batch = s.plan(0, step).rank(r)[m]
                    out.update(zip(batch, s.sample_ids(0, step, m), strict=True))
        return out

    assert ids(1) == ids(2) == ids(4)


def test_a_budget_below_the_largest_sample_is_refused_naming_it():
    tokens = [100, 900, 300]
    with pytest.raises(TokenBudgetError, match=r"sample 1: 900 tokens"):
        TokenBalancedSampler(tokens, global_batch_size=3, dp_rank=0, dp_size=1, token_budget=500)


def test_the_budget_check_names_each_sample_over_it_with_its_file_and_the_key():
    with pytest.raises(TokenBudgetError, match=r"^data.packing.token_budget=500 is below the largest sample: "
                       r"sample 1 \(b.mp4\): 900 tokens; raise the budget to at least 900"):  # fmt: skip
        check_token_budget(
            [100, 900, 300], 500, names=["a.mp4", "b.mp4", "c.png"], key="data.packing.token_budget"
        )


def test_a_fixed_micro_step_count_that_cannot_hold_the_step_is_refused():
    with pytest.raises(TokenBudgetError, match="micro_steps=1"):
        plan_step([0, 1, 2], [400, 400, 400], dp_size=1, token_budget=500, micro_steps=1)


def test_a_step_with_fewer_samples_than_micro_batches_is_refused():
    with pytest.raises(TokenBudgetError, match="a sample"):
        plan_step([0, 1, 2], [400, 400, 400], dp_size=2, token_budget=500)


def test_resume_at_another_dp_size_continues_at_the_next_global_step():
    first = sampler(0, 2)
    consumed = list(itertools.islice(iter(first), first.micro_steps_at(0, 0) + first.micro_steps_at(0, 1)))
    assert first.state_dict()["step"] == 2 and first.state_dict()["micro_offset"] == 0
    resumed = [sampler(r, 4) for r in range(4)]
    for s in resumed:
        s.load_state_dict(first.state_dict())
    rest = {i for s in resumed for batch in itertools.islice(iter(s), s.micro_steps_at(0, 2)) for i in batch}
    assert rest == set(first.step_samples(0, 2))
    assert not rest & {i for batch in consumed for i in batch}


def test_a_mid_step_state_refuses_another_dp_size():
    first = sampler(0, 2)
    next(iter(first))
    assert first.micro_offset == 1  # the first step has several micro-steps at this budget
    with pytest.raises(ValueError, match="step boundary"):
        sampler(0, 4).load_state_dict(first.state_dict())


class ShapedDataset(torch.utils.data.Dataset):
    """Item i: a latent of TOKENS[i] tokens (one frame of 1 x n) and its index."""

    def __len__(self) -> int:
        return len(TOKENS)

    def __getitem__(self, i: int) -> dict:
        return {"latents": torch.full((1, 1, TOKENS[i]), float(i)), "index": i, "prompt": f"clip {i}"}


def packed_loader(dp_rank: int, dp_size: int, **kw):
    kw = {"global_batch_size": GBS, "token_budget": BUDGET, "seed": SEED, "micro_steps": 16 // dp_size, **kw}
    return build_packed_dataloader(ShapedDataset(), TOKENS, dp_rank=dp_rank, dp_size=dp_size, **kw)


def test_the_packed_loader_yields_each_ranks_plan_as_per_sample_lists():
    loader = packed_loader(1, 2)
    plan = loader.sampler.plan(0, 0).rank(1)
    for micro, batch in zip(plan, itertools.islice(iter(loader), 8), strict=True):
        assert batch["index"].tolist() == micro
        assert [z.shape[-1] for z in batch["latents"]] == [TOKENS[i] for i in micro]  # shapes differ: a list
        assert batch["prompt"] == [f"clip {i}" for i in micro]
        assert [loader.sampler.dataset_index(s) for s in loader.last_sample_ids] == micro


def test_packed_loader_sample_ids_and_resume_are_layout_free():
    def first_steps(dp_size, steps=2):
        ids = {}
        for r in range(dp_size):
            loader = packed_loader(r, dp_size)
            for batch in itertools.islice(iter(loader), steps * (16 // dp_size)):
                ids.update(zip(batch["index"].tolist(), loader.last_sample_ids, strict=True))
        return ids

    assert first_steps(1) == first_steps(2) == first_steps(4)
    two = packed_loader(0, 2)
    list(itertools.islice(iter(two), 16))  # two global steps of 8 micro-steps
    state = two.state_dict()
    assert (state["step"], state["micro_offset"]) == (2, 0)
    resumed = [packed_loader(r, 4) for r in range(4)]
    seen = set()
    for loader in resumed:
        loader.load_state_dict(state)
        seen |= {i for batch in itertools.islice(iter(loader), 4) for i in batch["index"].tolist()}
    assert seen == set(two.sampler.step_samples(0, 2))


def test_the_packed_loader_refuses_a_budget_below_a_sample_before_reading():
    with pytest.raises(TokenBudgetError, match=rf"sample \d+: {max(TOKENS)} tokens"):
        packed_loader(0, 1, token_budget=max(TOKENS) - 1)


def test_a_fixed_micro_step_count_is_checked_for_the_whole_epoch_before_reading():
    with pytest.raises(TokenBudgetError, match=r"global step \d+ of epoch 0: .*micro_steps=4"):
        packed_loader(0, 1, micro_steps=4)
