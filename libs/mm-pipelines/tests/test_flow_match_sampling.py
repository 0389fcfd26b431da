"""Timestep sampling: uniform grid indices in [min_b*N, max_b*N), and the A14B expert split."""

from __future__ import annotations

import pytest
import torch
from mm_pipelines import FlowMatchScheduler

DRAWS = 20000


def draw(sched: FlowMatchScheduler, seed: int = 0) -> torch.Tensor:
    return sched.sample_indices(DRAWS, torch.Generator().manual_seed(seed), per_sample=True)


@pytest.mark.parametrize(
    ("expert", "task", "low", "high"),
    [
        ("high_noise", "t2v", 0, 417),
        ("low_noise", "t2v", 417, 1000),
        ("high_noise", "i2v", 0, 358),
        ("low_noise", "i2v", 358, 1000),
    ],
)
def test_expert_indices_stay_in_range_and_cover_its_edges(
    expert: str, task: str, low: int, high: int
) -> None:
    idx = draw(FlowMatchScheduler.for_expert(expert, task=task))
    assert int(idx.min()) == low
    assert int(idx.max()) == high - 1
    assert len(idx.unique()) == high - low


@pytest.mark.parametrize(("task", "t_boundary"), [("t2v", 875.0), ("i2v", 900.0)])
def test_expert_split_is_a_timestep_threshold_on_the_recipe_grid(task: str, t_boundary: float) -> None:
    high = FlowMatchScheduler.for_expert("high_noise", task=task)
    low = FlowMatchScheduler.for_expert("low_noise", task=task)
    assert high.timesteps_for(draw(high)).min().item() >= t_boundary - 0.5
    assert low.timesteps_for(draw(low)).max().item() < t_boundary
    assert high.shift == 5.0 and high.sigma_min == 0.0 and high.extra_one_step


def test_for_expert_grid_arguments_can_be_overridden() -> None:
    sched = FlowMatchScheduler.for_expert("high_noise", task="t2v", shift=3.0, sigma_min=0.003 / 1.002)
    assert sched.shift == 3.0 and sched.index_range == (0, 417)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("mid_noise",), {}, "expert"),
        (("high_noise",), {"task": "v2v"}, "task"),
        (("high_noise",), {"max_boundary": 0.5}, "max_boundary"),
    ],
)
def test_for_expert_rejects_bad_arguments(args: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FlowMatchScheduler.for_expert(*args, **kwargs)


def test_full_range_covers_the_whole_grid() -> None:
    idx = draw(FlowMatchScheduler())
    assert int(idx.min()) == 0 and int(idx.max()) == 999


def test_default_draws_one_index_per_batch() -> None:
    sched = FlowMatchScheduler()
    for seed in range(5):
        idx = sched.sample_indices(8, torch.Generator().manual_seed(seed))
        assert idx.shape == (8,) and len(idx.unique()) == 1


def test_per_sample_draws_independent_indices() -> None:
    idx = FlowMatchScheduler().sample_indices(64, torch.Generator().manual_seed(0), per_sample=True)
    assert len(idx.unique()) > 32


def test_same_generator_seed_gives_same_indices() -> None:
    sched = FlowMatchScheduler()
    a = sched.sample_indices(4, torch.Generator().manual_seed(7), per_sample=True)
    b = sched.sample_indices(4, torch.Generator().manual_seed(7), per_sample=True)
    assert torch.equal(a, b)


def test_lookups_reject_out_of_grid_indices() -> None:
    with pytest.raises(IndexError, match=r"\[0, 1000\)"):
        FlowMatchScheduler().sigmas_for(torch.tensor([1000]))


def test_sample_indices_rejects_empty_batch() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        FlowMatchScheduler().sample_indices(0)
