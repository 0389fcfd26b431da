"""DiffusionNFT (``DiffusionNFT``, ``OldPolicyEMA``): the loss and its gradient by hand on a velocity ``v = a x``
(old-policy rollout, rewards, forward process, implicit policies, KL), the old policy's EMA schedule and swap,
rollouts keyed by (step, prompt, group index) whatever micro-batches the prompts are split into, and the
refusals."""

from __future__ import annotations

import math

import pytest
import torch
from mm_pipelines import (
    DiffusionNFT,
    FlowMatchScheduler,
    FlowMatchT2VPipeline,
    OldPolicyEMA,
    SampleRNG,
    group_noise,
)


class _Scale(torch.nn.Module):
    """The velocity ``v = a x`` (timestep and text ignored)."""

    def __init__(self, a: float) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(a, dtype=torch.float64))

    def forward(self, hidden, timestep, text):
        return self.a * hidden.double()


class _Container(torch.nn.Module):
    def __init__(self, a: float, a_ref: float) -> None:
        super().__init__()
        self.predictor, self.reference = _Scale(a), _Scale(a_ref).requires_grad_(False)

    def is_trainable(self, role: str) -> bool:
        return role == "predictor"


def _by_hand(nft: DiffusionNFT, a: float, a_old: float, a_ref: float, rng: SampleRNG, shape, k: int):
    """The loss and d loss / d a of one prompt's clips, element by element in float64 (module docstring of
    ``mm_pipelines.diffusion_nft``), from the keyed start and forward-process noise."""
    groups, beta, clip, kl_weight = nft.group_size, nft.beta, nft.advantage_clip, nft.kl_weight
    start = group_noise(rng, "nft_start", groups, shape, "cpu").double().flatten(1).tolist()
    eps = group_noise(rng, f"nft_noise_{k}", groups, shape, "cpu").double().flatten(1).tolist()
    sigmas, t = nft.sigmas.tolist(), float(nft.sigmas[k])
    growth = math.prod(1 + a_old * (sigmas[j + 1] - sigmas[j]) for j in range(len(sigmas) - 1))
    x0 = [[sigmas[0] * z * growth for z in clip_noise] for clip_noise in start]  # the old policy's ODE
    rewards = [sum(x) / len(x) for x in x0]
    mean = sum(rewards) / groups
    std = math.sqrt(sum((q - mean) ** 2 for q in rewards) / groups)
    r = [0.5 + max(-clip, min(clip, (q - mean) / (std + 1e-4))) / (2 * clip) for q in rewards]
    loss = grad = 0.0
    for i in range(groups):
        x_t = [(1 - t) * x + t * e for x, e in zip(x0[i], eps[i])]
        n = len(x_t)
        pos = [xt - t * (beta * a + (1 - beta) * a_old) * xt - x for xt, x in zip(x_t, x0[i])]
        neg = [xt - t * ((1 + beta) * a_old - beta * a) * xt - x for xt, x in zip(x_t, x0[i])]
        w_pos, w_neg = sum(map(abs, pos)) / n, sum(map(abs, neg)) / n
        l_pos, l_neg = sum(e * e for e in pos) / n / w_pos, sum(e * e for e in neg) / n / w_neg
        d_pos = sum(2 * e * (-t * beta * xt) for e, xt in zip(pos, x_t)) / n / w_pos  # weights: no gradient
        d_neg = sum(2 * e * (t * beta * xt) for e, xt in zip(neg, x_t)) / n / w_neg
        kl = sum((a - a_ref) ** 2 * xt * xt for xt in x_t) / n
        d_kl = sum(2 * (a - a_ref) * xt * xt for xt in x_t) / n
        loss += (clip * (r[i] * l_pos + (1 - r[i]) * l_neg) / beta + kl_weight * kl) / groups
        grad += (clip * (r[i] * d_pos + (1 - r[i]) * d_neg) / beta + kl_weight * d_kl) / groups
    return loss, grad


def test_the_loss_and_its_gradient_equal_a_hand_computation_with_the_old_policy_an_ema():
    """Step 0 takes the old policy as the weights (a = 0.3); after an update to a = 0.5, step 1's old policy
    is ``0.5 * 0.3 + 0.5 * 0.5`` (``decay_1 = min(0.5 * 1, 0.5)``) and samples the clips."""
    nft = DiffusionNFT(
        FlowMatchT2VPipeline(FlowMatchScheduler()), group_size=3, sampling_steps=3, timestep_fraction=0.3,
        beta=0.7, advantage_clip=2.0, kl_weight=0.2, old_decay_ramp=0.5, old_decay_max=0.5,
    )  # fmt: skip
    nft.scorer = lambda latents, prompts, groups, names: (latents.double().flatten(1).mean(1), {})
    container, shape = _Container(0.3, a_ref=0.1), (2, 1, 1, 2)
    batch = {"latents": torch.zeros(1, *shape), "prompt_embeds": torch.zeros(1, 3, 5)}
    nft(container, rng=SampleRNG(seed=2, step=0, sample_ids=[4]), phase="nft", **batch)
    with torch.no_grad():
        container.predictor.a.fill_(0.5)
    rng = SampleRNG(seed=2, step=1, sample_ids=[4])
    out = nft(container, rng=rng, phase="nft", **batch)
    out.loss.backward()
    (k,) = nft.train_steps(rng)
    loss, grad = _by_hand(nft, 0.5, 0.4, 0.1, rng, shape, k)
    assert out.loss.item() == pytest.approx(loss, rel=1e-5)
    assert container.predictor.a.grad.item() == pytest.approx(grad, rel=1e-5)
    assert out.logged["nft_old_decay"] == 0.5
    assert container.predictor.a.item() == 0.5  # the old policy swapped out again


def test_the_old_policy_starts_as_the_weights_moves_once_per_step_and_swaps_in_and_out():
    layer = torch.nn.Linear(2, 1)
    frozen = torch.nn.Linear(2, 1).requires_grad_(False)
    container = torch.nn.ModuleDict({"policy": layer, "base": frozen})
    old = OldPolicyEMA(decay_ramp=0.25, decay_max=0.6)
    w0 = layer.weight.detach().clone()
    assert old.advance(container, 4) == 0.0  # the first step seen: the weights themselves
    with torch.no_grad():
        layer.weight.add_(1.0)
    assert old.advance(container, 5) == pytest.approx(0.6)  # min(0.25 * 5, 0.6)
    assert old.advance(container, 5) == pytest.approx(0.6)  # the step's second micro-batch: no update
    w1 = layer.weight.detach().clone()
    with old.swapped_in(container):
        torch.testing.assert_close(layer.weight, 0.6 * w0 + 0.4 * w1)
    torch.testing.assert_close(layer.weight, w1)
    assert old.decay(1) == 0.25
    assert len(old.state_dict()["average"]) == 2  # the trainable weight and bias only, not the frozen layer


def test_a_resumed_old_policy_continues_as_the_saved_one_at_the_same_and_at_another_layout():
    """The per-rank state of step 5, restored as saved (same layout) or reassembled from two ranks' row shards
    (another data-parallel size), brings step 6 to the average the uninterrupted run reaches."""
    container = torch.nn.ModuleDict({"policy": torch.nn.Linear(3, 4)})
    kept = OldPolicyEMA(decay_ramp=0.25, decay_max=0.6)
    kept.advance(container, 4)
    with torch.no_grad():
        container.policy.weight.add_(1.0)
    kept.advance(container, 5)
    saved = kept.state_dict()
    halves = [
        {**saved, "average": [a[:2] if a.dim() else a for a in saved["average"]]},
        {**saved, "average": [a[2:] if a.dim() else a for a in saved["average"]]},
    ]  # the row shards two FSDP2 ranks hold of the weight [4, 3] and the bias [4]
    same, other = OldPolicyEMA(decay_ramp=0.25, decay_max=0.6), OldPolicyEMA(decay_ramp=0.25, decay_max=0.6)
    same.load_state_dict(saved)
    other.load_rank_states(halves, dp_rank=0, dp_size=1)
    with torch.no_grad():
        container.policy.weight.mul_(0.5)
    for resumed in (kept, same, other):
        assert resumed.advance(container, 6) == pytest.approx(0.6)
    for resumed in (same, other):
        torch.testing.assert_close(resumed.average, kept.average)
    with pytest.raises(ValueError, match="not sharded over the data-parallel ranks' first dimension"):
        OldPolicyEMA(decay_ramp=0.25, decay_max=0.6).load_rank_states([saved, saved], dp_rank=0, dp_size=1)


def _nft(toys) -> tuple[DiffusionNFT, torch.nn.Module]:
    torch.manual_seed(0)  # the toy modules initialise from the global generator: not from earlier tests'
    container = toys.DeclaredContainer(trainable=("predictor",))
    nft = DiffusionNFT(
        FlowMatchT2VPipeline(FlowMatchScheduler()), group_size=3, sampling_steps=4, kl_weight=0
    )
    nft.scorer = lambda latents, prompts, groups, names: (latents.double().flatten(1).mean(1), {})
    return nft, container


def _prompts(toys, ids: list[int]) -> dict:
    batch = toys.make_batch(batch_size=4)
    return {k: v[ids] for k, v in batch.items()}


def test_rollouts_and_loss_are_the_same_whatever_micro_batches_the_prompts_are_split_into(toys):
    """Prompts 5 and 9 of step 3 in one micro-batch (one rank), or one each (two ranks): the same clips and
    loss (the mean of the two halves'); group indices differ, and another step draws other clips."""
    nft, container = _nft(toys)
    conditions = nft.base.prepare_conditions(container, _prompts(toys, [0, 1]))
    shape = tuple(conditions["latents"].shape[1:])
    texts = conditions["prompt_embeds"].repeat_interleave(3, dim=0)

    def rollout(ids, rows, step=3):
        part = {"prompt_embeds": texts[rows]}
        return nft.rollout(container, part, SampleRNG(seed=1, step=step, sample_ids=ids), shape)

    both = rollout([5, 9], slice(0, 6))
    halves = torch.cat([rollout([5], slice(0, 3)), rollout([9], slice(3, 6))])
    torch.testing.assert_close(both, halves, rtol=0, atol=1e-6)
    assert not torch.allclose(both[0], both[1])
    assert not torch.allclose(rollout([5, 9], slice(0, 6), step=4), both)

    def loss(ids, rows):
        return nft(
            container, rng=SampleRNG(seed=1, step=3, sample_ids=ids), phase="nft", **_prompts(toys, rows)
        )

    joint, parts = loss([5, 9], [0, 1]), [loss([5], [0]), loss([9], [1])]
    assert joint.loss.item() == pytest.approx((parts[0].loss.item() + parts[1].loss.item()) / 2, abs=1e-6)


def test_bad_options_and_a_call_outside_the_phase_are_refused(toys):
    base = FlowMatchT2VPipeline(FlowMatchScheduler())
    with pytest.raises(ValueError, match=r"group_size must be >= 2 .*; beta must be > 0"):
        DiffusionNFT(base, group_size=1, beta=0)
    with pytest.raises(ValueError, match="decay_max in \\[0, 1\\)"):
        DiffusionNFT(base, old_decay_max=1.0)
    with pytest.raises(ValueError, match="text-to-video only"):
        DiffusionNFT(FlowMatchT2VPipeline(FlowMatchScheduler(), task="i2v"))
    nft, container = _nft(toys)
    with pytest.raises(ValueError, match="runs in the phase 'nft'"):
        nft(container, rng=SampleRNG.for_batch(2), phase="grpo", **_prompts(toys, [0, 1]))
    nft.scorer = None
    with pytest.raises(ValueError, match="DiffusionNFT scores its rollouts with training.rewards"):
        nft(container, rng=SampleRNG.for_batch(2), phase="nft", **_prompts(toys, [0, 1]))
