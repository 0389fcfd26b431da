"""The Wan flow-match sigma grid is a numeric contract (docs/DESIGN.md "The flow-match grid")."""

from __future__ import annotations

import math

import pytest
import torch
from mm_pipelines import FlowMatchScheduler


def reference_grid(n: int, shift: float, sigma_min: float, sigma_max: float = 1.0, extra: bool = False):
    """Independent python-float grid: (sigmas, timesteps, weights) per docs/DESIGN.md "The flow-match grid"."""
    points = n + 1 if extra else n
    base = [sigma_max + (sigma_min - sigma_max) * i / (points - 1) for i in range(points)][:n]
    sigmas = [shift * s / (1 + (shift - 1) * s) for s in base]
    timesteps = [1000.0 * s for s in sigmas]
    y = [math.exp(-2 * ((t - 500) / 1000) ** 2) for t in timesteps]
    y_min = min(y)
    total = sum(v - y_min for v in y)
    weights = [(v - y_min) * n / total for v in y]
    return sigmas, timesteps, weights


def assert_close_list(actual: torch.Tensor, expected: list[float], rtol: float, atol: float) -> None:
    torch.testing.assert_close(
        actual.double(), torch.tensor(expected, dtype=torch.float64), rtol=rtol, atol=atol
    )


def test_default_grid_runs_from_t_1000_to_1000_over_112() -> None:
    sched = FlowMatchScheduler()
    assert sched.sigmas.shape == (1000,)
    assert sched.timesteps[0].item() == 1000.0
    # sigma_min = 0.003/1.002 shifted by 3 is exactly 0.009/1.008 = 1/112.
    assert sched.timesteps64[-1].item() == pytest.approx(1000 / 112, rel=1e-12)
    assert sched.sigmas[-1].item() == pytest.approx(0.008929, abs=5e-7)


def test_default_grid_matches_formula_everywhere() -> None:
    sched = FlowMatchScheduler()
    sigmas, timesteps, _ = reference_grid(1000, 3.0, 0.003 / 1.002)
    assert_close_list(sched.sigmas64, sigmas, rtol=1e-12, atol=1e-12)
    assert_close_list(sched.sigmas, sigmas, rtol=1e-6, atol=1e-7)
    assert_close_list(sched.timesteps, timesteps, rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("index", [1, 250, 500, 750, 998])
def test_default_grid_values_in_between(index: int) -> None:
    s = 1.0 + (0.003 / 1.002 - 1.0) * index / 999
    expected = 3.0 * s / (1 + 2.0 * s)
    assert FlowMatchScheduler().sigmas64[index].item() == pytest.approx(expected, rel=1e-12)


def test_wan22_recipe_grid_shift5_sigma_min0_extra_one_step() -> None:
    sched = FlowMatchScheduler(shift=5.0, sigma_min=0.0, extra_one_step=True)
    sigmas, timesteps, _ = reference_grid(1000, 5.0, 0.0, extra=True)
    assert sched.timesteps[0].item() == 1000.0
    # 1001 points with the last (0) dropped: s_i = 1 - i/1000.
    assert sched.sigmas64[500].item() == pytest.approx(2.5 / 3.0, rel=1e-12)
    assert sched.sigmas64[-1].item() == pytest.approx(0.005 / 1.004, rel=1e-12)
    assert sched.timesteps[-1].item() == pytest.approx(4.98008, abs=1e-4)
    assert_close_list(sched.timesteps, timesteps, rtol=1e-6, atol=1e-4)


def test_grid_differs_from_a_plain_linspace_over_n_plus_one_points() -> None:
    with_extra = FlowMatchScheduler(extra_one_step=True).sigmas64
    without = FlowMatchScheduler(extra_one_step=False).sigmas64
    assert with_extra[0] == without[0] == 1.0
    assert (without[1:] - with_extra[1:]).abs().max() > 1e-4


@pytest.mark.parametrize("kwargs", [{}, {"shift": 5.0, "sigma_min": 0.0, "extra_one_step": True}])
def test_weights_have_mean_one_and_match_formula(kwargs: dict) -> None:
    sched = FlowMatchScheduler(**kwargs)
    _, _, weights = reference_grid(1000, kwargs.get("shift", 3.0), kwargs.get("sigma_min", 0.003 / 1.002),
                                   extra=kwargs.get("extra_one_step", False))  # fmt: skip
    assert sched.weights64.mean().item() == pytest.approx(1.0, abs=1e-12)
    assert_close_list(sched.weights, weights, rtol=1e-5, atol=1e-6)


def test_weight_is_zero_at_t_1000_and_peaks_near_t_500() -> None:
    sched = FlowMatchScheduler()
    assert sched.weights[0].item() == 0.0
    peak = int(sched.weights.argmax())
    assert abs(sched.timesteps[peak].item() - 500) < 1.0


def test_weighting_off_gives_unit_weights() -> None:
    sched = FlowMatchScheduler(weighting=False)
    assert torch.equal(sched.weights_for(torch.tensor([0, 10, 999])), torch.ones(3))


@pytest.mark.parametrize("num_train_timesteps", [10, 100])
def test_grid_size_and_timestep_scale_follow_num_train_timesteps(num_train_timesteps: int) -> None:
    sched = FlowMatchScheduler(num_train_timesteps=num_train_timesteps)
    assert sched.sigmas.shape == (num_train_timesteps,)
    torch.testing.assert_close(sched.timesteps64, sched.sigmas64 * num_train_timesteps)
    assert sched.weights64.mean().item() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_train_timesteps": 0}, "num_train_timesteps"),
        ({"num_train_timesteps": 10.5}, "num_train_timesteps"),
        ({"shift": 0.0}, "shift"),
        ({"sigma_min": 1.0}, "sigma_min"),
        ({"sigma_min": -0.1}, "sigma_min"),
        ({"sigma_max": 1.5}, "sigma_max"),
        ({"min_boundary": 0.5, "max_boundary": 0.5}, "min_boundary"),
        ({"max_boundary": 1.2}, "max_boundary"),
        ({"num_train_timesteps": 10, "min_boundary": 0.31, "max_boundary": 0.39}, "no grid index"),
    ],
)
def test_invalid_arguments_raise_naming_the_argument(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FlowMatchScheduler(**kwargs)
