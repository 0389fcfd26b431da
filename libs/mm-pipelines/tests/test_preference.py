"""Diffusion-DPO (``DiffusionDPO``, ``dpo_loss``): the loss as the formula says, both members of a pair
noised alike, the reference frozen, and what the phase logs."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from mm_pipelines import (
    DiffusionDPO,
    FlowMatchScheduler,
    FlowMatchT2VPipeline,
    SampleRNG,
    dpo_loss,
    split_pair,
)


def test_the_dpo_loss_and_margin_equal_a_hand_computation():
    policy_w, policy_l = torch.tensor([0.5, 1.0]), torch.tensor([0.75, 0.5])
    reference_w, reference_l = torch.tensor([0.625, 1.0]), torch.tensor([0.5, 0.25])
    loss, margin = dpo_loss(policy_w, policy_l, reference_w, reference_l, beta=4.0)
    # pair 0: -4 * ((0.5 - 0.625) - (0.75 - 0.5)) = 1.5;  pair 1: -4 * ((1 - 1) - (0.5 - 0.25)) = 1
    torch.testing.assert_close(margin, torch.tensor([1.5, 1.0]))
    by_hand = (
        math.log(1 + math.exp(-1.5)) + math.log(1 + math.exp(-1.0))
    ) / 2  # -log sigmoid(m) = log(1 + e^-m)
    assert loss.item() == pytest.approx(by_hand, rel=1e-6)


def test_a_pair_batch_splits_into_its_preferred_and_rejected_members():
    batch = {"video": "w", "rejected_video": "l", "prompt": ["p"], "index": 3}
    preferred, rejected = split_pair(batch)
    assert preferred == {"video": "w", "prompt": ["p"], "index": 3}
    assert rejected == {"video": "l", "prompt": ["p"], "index": 3}
    with pytest.raises(
        KeyError, match="Diffusion-DPO needs pairs: the rejected member's keys as rejected_<key>"
    ):
        split_pair({"video": "w"})


def _pairs(toys):
    preferred, rejected = toys.make_batch(seed=0), toys.make_batch(seed=1)
    return {**preferred, "rejected_video": rejected["video"]}


def _with_reference(toys, seed: int = 0):
    torch.manual_seed(seed)  # the toy modules initialise from the global generator: not from earlier tests'
    container = toys.DeclaredContainer(trainable=("predictor",))
    container.reference = copy.deepcopy(container.predictor)
    return container


def test_the_policy_equal_to_its_reference_has_loss_log_2_and_margin_0(toys):
    out = DiffusionDPO(FlowMatchT2VPipeline(FlowMatchScheduler()), beta=100.0)(
        _with_reference(toys), rng=SampleRNG.for_batch(2), phase="dpo", **_pairs(toys)
    )
    assert out.loss.item() == pytest.approx(math.log(2), abs=1e-6)
    assert out.logged == {"dpo_margin": 0.0, "dpo_accuracy": 0.0} and out.metrics["num_samples"] == 2


def test_both_members_of_a_pair_get_the_same_timestep_and_noise(toys):
    """What the predictor sees of each member: the same timesteps, and inputs that differ by exactly
    ``(1 - sigma) (x0_w - x0_l)``: the same noise."""
    pipeline = FlowMatchT2VPipeline(FlowMatchScheduler())
    container, seen = _with_reference(toys), []
    container.predictor.register_forward_hook(lambda _, args, __: seen.append((args[0].detach(), args[1])))
    batch = _pairs(toys)
    DiffusionDPO(pipeline)(container, rng=SampleRNG.for_batch(2, seed=4), phase="dpo", **batch)
    (x_w, t_w), (x_l, t_l) = seen  # the policy's two calls (the reference is another module)
    torch.testing.assert_close(t_w, t_l)
    preferred, rejected = split_pair(batch)
    x0 = [pipeline.prepare_conditions(container, member)["latents"] for member in (preferred, rejected)]
    sigma = (t_w / 1000).view(-1, 1, 1, 1, 1)
    torch.testing.assert_close(x_w - x_l, (1 - sigma) * (x0[0] - x0[1]), rtol=1e-4, atol=1e-5)


def test_the_gradient_reaches_the_policy_only_and_lowers_the_loss(toys):
    container = _with_reference(toys)
    dpo = DiffusionDPO(FlowMatchT2VPipeline(FlowMatchScheduler()), beta=50.0)
    optimizer = torch.optim.SGD(container.predictor.parameters(), lr=0.05)
    losses = []
    for _ in range(60):
        out = dpo(container, rng=SampleRNG(seed=0, step=0, sample_ids=[0, 1]), phase="dpo", **_pairs(toys))
        out.loss.backward()
        assert all(p.grad is None for p in container.reference.parameters())
        optimizer.step()
        optimizer.zero_grad()
        losses.append(out.loss.item())
    assert losses[-1] < losses[0] - 0.1 and out.logged["dpo_margin"] > 0 and out.logged["dpo_accuracy"] == 1.0


def test_a_policy_without_reference_or_adapters_is_refused(toys):
    dpo = DiffusionDPO(FlowMatchT2VPipeline(FlowMatchScheduler()))
    with pytest.raises(TypeError, match="Diffusion-DPO needs a reference: the sub-model 'reference'"):
        dpo(toys.DeclaredContainer(), rng=SampleRNG.for_batch(2), phase="dpo", **_pairs(toys))


def test_dpo_runs_in_its_phase_only(toys):
    dpo = DiffusionDPO(FlowMatchT2VPipeline(FlowMatchScheduler()))
    with pytest.raises(ValueError, match=r"runs in the phase 'dpo'; set training.phases: \{dpo: "):
        dpo(_with_reference(toys), rng=SampleRNG.for_batch(2), **_pairs(toys))


def test_the_held_out_loss_is_per_pair_and_log_2_for_the_reference_itself(toys):
    dpo = DiffusionDPO(FlowMatchT2VPipeline(FlowMatchScheduler()))
    losses = dpo.validation_loss(_with_reference(toys), _pairs(toys), SampleRNG.for_batch(2), num_timesteps=3)
    torch.testing.assert_close(losses, torch.full((2,), math.log(2)))
