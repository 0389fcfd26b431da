"""The A14B experts on the flow-match grid: each expert's training range, and one boundary index for
one-expert runs, ``expert: both`` routing and sampling (moved here from mm-pipelines with the grid)."""

from __future__ import annotations

import math

import pytest
import torch
from mm_pipelines import FlowMatchScheduler, boundary_index
from wan22_train.experts import boundary_timestep, expert_scheduler
from wan22_train.pipeline import Wan22Pipeline

DRAWS = 20000
#: A user-given boundary between two grid points: 0.4175 * 1000 = 417.5. ``round`` (banker's) gives
#: 418, ``floor`` 417: before one function mapped boundaries, ``expert: both`` routed with the first
#: and one-expert runs trained with the second.
BETWEEN_GRID_POINTS = 0.4175


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
    idx = draw(expert_scheduler(expert, task))
    assert int(idx.min()) == low
    assert int(idx.max()) == high - 1
    assert len(idx.unique()) == high - low


@pytest.mark.parametrize(("task", "t_boundary"), [("t2v", 875.0), ("i2v", 900.0)])
def test_expert_split_is_a_timestep_threshold_on_the_recipe_grid(task: str, t_boundary: float) -> None:
    high, low = expert_scheduler("high_noise", task), expert_scheduler("low_noise", task)
    assert high.timesteps_for(draw(high)).min().item() >= t_boundary - 0.5
    assert low.timesteps_for(draw(low)).max().item() < t_boundary
    assert high.shift == 5.0 and high.sigma_min == 0.0 and high.extra_one_step


def test_expert_grid_arguments_can_be_overridden() -> None:
    sched = expert_scheduler("high_noise", "t2v", shift=3.0, sigma_min=0.003 / 1.002)
    assert sched.shift == 3.0 and sched.index_range == (0, 417)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [(("mid_noise",), {}, "expert"), (("high_noise",), {"max_boundary": 0.5}, "max_boundary")],
)
def test_expert_scheduler_rejects_bad_arguments(args: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        expert_scheduler(*args, **kwargs)


def test_round_and_floor_disagree_on_a_boundary_between_grid_points() -> None:
    assert round(BETWEEN_GRID_POINTS * 1000) == 418
    assert math.floor(BETWEEN_GRID_POINTS * 1000 + 1e-9) == boundary_index(BETWEEN_GRID_POINTS, 1000) == 417


def test_both_experts_route_at_the_index_where_one_expert_runs_split_the_grid() -> None:
    options = {"task": "t2v", "boundary": BETWEEN_GRID_POINTS}
    both = Wan22Pipeline.from_options({**options, "expert": "both"})
    high = Wan22Pipeline.from_options({**options, "expert": "high_noise"})
    low = Wan22Pipeline.from_options({**options, "expert": "low_noise"})
    assert both.boundary_index == high.scheduler.index_range[1] == low.scheduler.index_range[0] == 417


def test_every_expert_setting_and_sampling_hand_over_at_the_same_timestep() -> None:
    want = float(expert_scheduler("both").timesteps[417])
    for expert in ("both", "high_noise", "low_noise"):
        options = {"task": "t2v", "expert": expert, "boundary": BETWEEN_GRID_POINTS}
        assert Wan22Pipeline.from_options(options).boundary_timestep() == want
        assert boundary_timestep(options) == want


def test_sampling_boundary_follows_the_configured_grid() -> None:
    options = {"task": "i2v", "expert": "both", "shift": 3.0}
    assert boundary_timestep(options) == float(
        FlowMatchScheduler(shift=3.0, sigma_min=0.0, extra_one_step=True).timesteps[358]
    )


def test_a_whole_range_run_has_no_expert_boundary() -> None:
    with pytest.raises(ValueError, match="no expert boundary"):
        boundary_timestep({"expert": "all"})
