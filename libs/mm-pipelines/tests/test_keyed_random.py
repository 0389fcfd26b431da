"""SampleRNG: draws keyed by (seed, step, global sample index, purpose), whatever the micro-batch split."""

from __future__ import annotations

import pytest
import torch
from mm_pipelines import FlowMatchScheduler, FlowMatchT2VPipeline, SampleRNG


def rng(ids, *, seed: int = 0, step: int = 5) -> SampleRNG:
    return SampleRNG(seed=seed, step=step, sample_ids=ids)


def test_a_sample_draws_the_same_in_any_micro_batch_split() -> None:
    whole = rng([8, 9, 10, 11]).randn("noise", (3, 2))
    halves = torch.cat([rng([8, 9]).randn("noise", (3, 2)), rng([10, 11]).randn("noise", (3, 2))])
    singles = torch.cat([rng([i]).randn("noise", (3, 2)) for i in (8, 9, 10, 11)])
    assert torch.equal(whole, halves) and torch.equal(whole, singles)


def uniform(keys: SampleRNG, purpose: str) -> torch.Tensor:
    return keys.per_sample(purpose, lambda g: torch.rand(4, generator=g))


def test_draws_ignore_the_global_rng_and_earlier_draws() -> None:
    torch.manual_seed(1)
    first = uniform(rng([3]), "sigma")
    torch.manual_seed(2)
    torch.rand(100)
    keys = rng([3])
    uniform(keys, "sigma")  # an earlier draw of the same purpose changes nothing
    assert torch.equal(uniform(keys, "sigma"), first)


@pytest.mark.parametrize(
    "other", [{"seed": 1}, {"step": 6}, {"ids": [4]}, {"purpose": "audio_noise"}], ids=lambda o: next(iter(o))
)
def test_each_part_of_the_key_changes_the_draw(other: dict) -> None:
    base = {"seed": 0, "step": 5, "ids": [3], "purpose": "noise"}
    a = rng(base["ids"], seed=base["seed"], step=base["step"]).randn(base["purpose"], (8,))
    key = {**base, **other}
    b = rng(key["ids"], seed=key["seed"], step=key["step"]).randn(key["purpose"], (8,))
    assert not torch.equal(a, b)


def test_samples_of_one_micro_batch_draw_independently() -> None:
    draws = rng(range(64)).per_sample("timestep", lambda g: torch.randint(0, 1000, (), generator=g))
    assert draws.shape == (64,) and len(draws.unique()) > 32


def test_the_step_draw_is_shared_by_every_micro_batch_of_the_step() -> None:
    assert rng([0, 1]).step_randint("timestep", 0, 1000) == rng([6, 7]).step_randint("timestep", 0, 1000)
    steps = {rng([0], step=s).step_randint("timestep", 0, 1000) for s in range(16)}
    assert len(steps) > 8


def test_scheduler_indices_per_sample_follow_the_sample_and_per_step_fill_the_batch() -> None:
    sched = FlowMatchScheduler()
    whole = sched.draw_indices(rng([0, 1, 2, 3]), "sample")
    split = torch.cat([sched.draw_indices(rng([0, 1]), "sample"), sched.draw_indices(rng([2, 3]), "sample")])
    assert torch.equal(whole, split) and len(whole.unique()) > 1
    step = sched.draw_indices(rng([0, 1, 2, 3]), "step")
    assert len(step.unique()) == 1 and torch.equal(step[:2], sched.draw_indices(rng([4, 5]), "step"))


def test_pipeline_noising_of_a_batch_is_the_noising_of_its_samples(toys) -> None:
    pipe, container = FlowMatchT2VPipeline(FlowMatchScheduler()), toys.Container()
    batch = toys.make_batch(batch_size=2)
    conditions = pipe.prepare_conditions(container, batch)
    both = pipe.noising(conditions, rng([20, 21]))
    one = [pipe.noising({k: v[i : i + 1] for k, v in conditions.items()}, rng([20 + i])) for i in range(2)]
    for key in ("hidden_states", "timestep", "target", "weight"):
        assert torch.equal(both[key], torch.cat([o[key] for o in one])), key


def test_a_drawing_pipeline_without_keys_is_an_error_that_says_what_to_pass(toys, batch) -> None:
    with pytest.raises(ValueError, match=r"pass rng=SampleRNG"):
        FlowMatchT2VPipeline(FlowMatchScheduler())(toys.Container(), **batch)


def test_keys_for_another_batch_size_are_refused(toys, batch) -> None:
    with pytest.raises(ValueError, match="keys 3 samples.*batch has 2"):
        FlowMatchT2VPipeline(FlowMatchScheduler())(toys.Container(), rng=rng([0, 1, 2]), **batch)
