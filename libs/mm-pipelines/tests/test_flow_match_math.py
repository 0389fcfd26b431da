"""Noising, target, weight lookup and the Euler sampling step against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from mm_pipelines import FlowMatchScheduler


def default_sigma(index: int) -> float:
    s = 1.0 + (0.003 / 1.002 - 1.0) * index / 999
    return 3.0 * s / (1 + 2.0 * s)


def test_add_noise_mixes_per_sample_sigma() -> None:
    g = torch.Generator().manual_seed(0)
    x0, noise = torch.randn(2, 3, 2, generator=g), torch.randn(2, 3, 2, generator=g)
    sched = FlowMatchScheduler()
    x_t = sched.add_noise(x0, noise, sched.sigmas_for(torch.tensor([100, 800])))
    for b, index in enumerate([100, 800]):
        s = default_sigma(index)
        for i, (a, e) in enumerate(zip(x0[b].flatten().tolist(), noise[b].flatten().tolist())):
            assert x_t[b].flatten()[i].item() == pytest.approx((1 - s) * a + s * e, rel=1e-5, abs=1e-6)


def test_add_noise_at_sigma_one_is_pure_noise_and_keeps_dtype() -> None:
    x0, noise = torch.ones(2, 4, dtype=torch.bfloat16), torch.full((2, 4), 3.0, dtype=torch.bfloat16)
    x_t = FlowMatchScheduler.add_noise(x0, noise, 1.0)
    assert x_t.dtype == torch.bfloat16 and torch.equal(x_t, noise)


def test_add_noise_rejects_mismatched_sigma_shape() -> None:
    with pytest.raises(ValueError, match="sigma must be a scalar or shape"):
        FlowMatchScheduler.add_noise(torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([0.1, 0.2, 0.3]))


def test_training_target_is_noise_minus_x0_in_fp32() -> None:
    x0 = torch.tensor([[1.0, -2.0]], dtype=torch.bfloat16)
    noise = torch.tensor([[0.5, 0.25]], dtype=torch.bfloat16)
    target = FlowMatchScheduler.training_target(x0, noise)
    assert target.dtype == torch.float32 and target.tolist() == [[-0.5, 2.25]]


@pytest.mark.parametrize("index", [0, 100, 417, 999])
def test_training_weight_at_grid_timesteps_equals_formula(index: int) -> None:
    sched = FlowMatchScheduler()
    ts = [1000 * default_sigma(i) for i in range(1000)]
    y = [math.exp(-2 * ((t - 500) / 1000) ** 2) for t in ts]
    expected = (y[index] - min(y)) * 1000 / sum(v - min(y) for v in y)
    weight = sched.training_weight(sched.timesteps_for(torch.tensor([index])))
    assert weight.item() == pytest.approx(expected, rel=1e-5, abs=1e-7)


def test_training_weight_uses_nearest_grid_timestep() -> None:
    sched = FlowMatchScheduler()
    t = sched.timesteps_for(torch.tensor([300])) + 0.01
    assert torch.equal(sched.training_weight(t), sched.weights_for(torch.tensor([300])))


def test_euler_step_moves_by_sigma_difference_times_velocity() -> None:
    x = torch.tensor([[1.0, 2.0]])
    v = torch.tensor([[0.5, -4.0]])
    out = FlowMatchScheduler.step(v, 0.75, 0.5, x)
    assert out.tolist() == [[1.0 - 0.25 * 0.5, 2.0 + 0.25 * 4.0]]


def test_inference_sigmas_follow_the_grid_convention_and_end_at_zero() -> None:
    sched = FlowMatchScheduler()
    timesteps = sched.set_inference_timesteps(4, shift=5.0)
    base = [1.0 + (0.003 / 1.002 - 1.0) * i / 3 for i in range(4)]
    expected = [5.0 * s / (1 + 4.0 * s) for s in base] + [0.0]
    torch.testing.assert_close(sched.inference_sigmas.double(), torch.tensor(expected, dtype=torch.float64))
    torch.testing.assert_close(timesteps.double(), 1000 * torch.tensor(expected[:-1], dtype=torch.float64))


def test_euler_sampling_with_the_exact_velocity_recovers_x0() -> None:
    g = torch.Generator().manual_seed(1)
    x0, noise = torch.randn(2, 5, generator=g), torch.randn(2, 5, generator=g)
    sched = FlowMatchScheduler()
    sched.set_inference_timesteps(7)
    sigmas = sched.inference_sigmas
    x = sched.add_noise(x0, noise, sigmas[0])
    for i in range(7):
        x = sched.step(sched.training_target(x0, noise), sigmas[i], sigmas[i + 1], x)
    torch.testing.assert_close(x, x0, rtol=1e-5, atol=1e-5)


def test_set_inference_timesteps_rejects_zero_steps() -> None:
    with pytest.raises(ValueError, match="num_steps"):
        FlowMatchScheduler().set_inference_timesteps(0)
