"""Timestep sampling: uniform grid indices in [min_b*N, max_b*N), cut at ``boundary_index``."""

from __future__ import annotations

import pytest
import torch
from mm_pipelines import FlowMatchScheduler, boundary_index

DRAWS = 20000


def draw(sched: FlowMatchScheduler, seed: int = 0) -> torch.Tensor:
    return sched.sample_indices(DRAWS, torch.Generator().manual_seed(seed), per_sample=True)


def test_boundary_index_floors_and_absorbs_float_noise() -> None:
    assert boundary_index(0.417, 1000) == 417  # 0.417 * 1000 = 416.99999999999994
    assert boundary_index(0.4175, 1000) == 417  # between two grid points: the lower one
    assert boundary_index(1.0, 1000) == 1000


def test_index_range_is_cut_at_the_boundary_index() -> None:
    sched = FlowMatchScheduler(min_boundary=0.125, max_boundary=0.4175)
    assert sched.index_range == (boundary_index(0.125, 1000), boundary_index(0.4175, 1000)) == (125, 417)
    idx = draw(sched)
    assert int(idx.min()) == 125 and int(idx.max()) == 416


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
