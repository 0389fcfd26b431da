"""The LTX-2 sigma sampler, checked against its definition."""

from __future__ import annotations

import math

import pytest
import torch
from ltx2_train.timesteps import SigmaSampler


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


@pytest.mark.parametrize(
    ("tokens", "shift"), [(1024, 0.95), (4096, 2.05), (2560, 1.5), (512, 0.95 - 512 * 1.1 / 3072)]
)
def test_shift_is_the_line_through_1024_tokens_0_95_and_4096_tokens_2_05(tokens, shift):
    assert SigmaSampler().shift(tokens) == pytest.approx(shift, abs=1e-12)


def test_shift_anchor_points_are_configurable():
    sampler = SigmaSampler(min_tokens=256, min_shift=0.5, max_tokens=1280, max_shift=1.5)
    assert sampler.shift(768) == pytest.approx(1.0)


@pytest.mark.parametrize("tokens", [1024, 2560, 6144])
def test_median_and_quartiles_of_10k_sigmas_match_the_shifted_logit_normal(tokens):
    sampler = SigmaSampler(std=1.0)
    sigmas = sampler.sample(10_000, tokens, generator=torch.Generator().manual_seed(0)).double()
    shift = sampler.shift(tokens)
    q25, q50, q75 = torch.quantile(sigmas, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)).tolist()
    z = 0.6744897501960817  # standard normal 75% quantile
    assert q50 == pytest.approx(sigmoid(shift), abs=0.01)
    assert q25 == pytest.approx(sigmoid(shift - z), abs=0.01)
    assert q75 == pytest.approx(sigmoid(shift + z), abs=0.01)


def test_std_widens_the_logit_spread():
    narrow = SigmaSampler(std=0.5).sample(10_000, 1024, generator=torch.Generator().manual_seed(1))
    logits = torch.logit(narrow.double())
    assert logits.std().item() == pytest.approx(0.5, rel=0.03)
    assert logits.mean().item() == pytest.approx(0.95, abs=0.02)


def test_uniform_mode_ignores_the_token_count():
    sampler = SigmaSampler(mode="uniform")
    a = sampler.sample(10_000, 1024, generator=torch.Generator().manual_seed(2))
    b = sampler.sample(10_000, 9999, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(a, b)
    assert 0.0 <= a.min().item() and a.max().item() < 1.0
    assert a.mean().item() == pytest.approx(0.5, abs=0.01)
    assert torch.quantile(a, 0.25).item() == pytest.approx(0.25, abs=0.01)


def test_unknown_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="timestep_sampling='beta'"):
        SigmaSampler(mode="beta")
