"""Flow-GRPO (``FlowGRPO``, ``mm_pipelines.rollout``): the SDE transition and its log-probability as the
formulas say, the advantages and the clipped loss by hand, and rollouts keyed by (step, prompt, group index)
alone, whatever micro-batches (ranks) the prompts are split into."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from mm_pipelines import (
    FlowGRPO,
    FlowMatchScheduler,
    FlowMatchT2VPipeline,
    SampleRNG,
    clipped_policy_loss,
    group_advantages,
    sde_transition,
    transition_log_prob,
)

SIGMAS = torch.tensor([1.0, 0.75, 0.5, 0.0], dtype=torch.float64)


def _gaussian_log_density(value: float, mean: float, std: float) -> float:
    return math.log(math.exp(-((value - mean) ** 2) / (2 * std**2)) / (std * math.sqrt(2 * math.pi)))


@pytest.mark.parametrize("k", [0, 1])
def test_a_transitions_mean_std_and_log_prob_equal_a_hand_computation(k):
    x, v, x_next = [0.5, -1.0], [0.25, 2.0], [0.1, -0.3]
    a, s, dt = 0.5, float(SIGMAS[k]), float(SIGMAS[k + 1] - SIGMAS[k])
    g = a * math.sqrt(s / ((1 - s) if s < 1 else (1 - 0.75)))  # at s = 1 the next sigma's gap
    means = [xi + (vi + g * g / (2 * s) * (xi + (1 - s) * vi)) * dt for xi, vi in zip(x, v)]
    std = g * math.sqrt(-dt)
    by_hand = sum(_gaussian_log_density(y, m, std) for y, m in zip(x_next, means)) / 2  # mean over elements

    mean, got_std = sde_transition(torch.tensor([x]), torch.tensor([v]), SIGMAS, k, a)
    torch.testing.assert_close(mean, torch.tensor([means]), rtol=1e-6, atol=1e-6)
    assert got_std == pytest.approx(std, rel=1e-12)
    assert float(transition_log_prob(torch.tensor([x_next]), mean, got_std)) == pytest.approx(
        by_hand, rel=1e-5
    )


def test_group_advantages_normalise_within_each_prompt_and_clip():
    rewards = torch.tensor([[1.0, 2.0, 3.0], [5.0, 5.0, math.nan], [0.0, 0.0, 9.0]], dtype=torch.float64)
    advantages = group_advantages(rewards, clip=1.3)
    std0 = math.sqrt(2 / 3)  # population std of 1, 2, 3
    by_hand = [
        [-1 / (std0 + 1e-4), 0.0, 1 / (std0 + 1e-4)],
        [0.0, 0.0, 0.0],  # equal rewards; the NaN (a dropped clip) gets 0
        [-3 / (math.sqrt(18) + 1e-4), -3 / (math.sqrt(18) + 1e-4), 1.3],  # 6 / (sqrt(18) + eps) = 1.41 -> 1.3
    ]
    torch.testing.assert_close(advantages, torch.tensor(by_hand, dtype=torch.float64))


def test_advantages_without_scale_are_the_rewards_less_their_groups_mean():
    rewards = torch.tensor([[1.0, 2.0, 3.0], [5.0, 5.01, math.nan], [0.0, 0.0, 9.0]], dtype=torch.float64)
    advantages = group_advantages(rewards, clip=4.0, scale="none")
    by_hand = [[-1.0, 0.0, 1.0], [-0.005, 0.005, 0.0], [-3.0, -3.0, 4.0]]  # 6 -> clipped to 4
    torch.testing.assert_close(advantages, torch.tensor(by_hand, dtype=torch.float64))
    with pytest.raises(ValueError, match="advantage scale must be one of"):
        group_advantages(rewards, clip=4.0, scale="batch")


def test_the_clipped_policy_loss_and_its_gradient_equal_a_hand_computation():
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64)
    old = torch.zeros(4, dtype=torch.float64)
    log_prob = torch.log(torch.tensor([1.5, 0.5, 1.5, 0.5], dtype=torch.float64)).requires_grad_()
    loss, outside = clipped_policy_loss(log_prob, old, advantages, clip_range=0.2)
    # max(-A r, -A clip(r, 0.8, 1.2)): A=1,r=1.5 -> -1.2 (clipped); A=1,r=0.5 -> -0.5; A=-1,r=1.5 -> 1.5;
    # A=-1,r=0.5 -> 0.8 (clipped)
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 1.5 + 0.8) / 4, rel=1e-12)
    assert outside.tolist() == [True, True, True, True]
    loss.backward()
    # d(-A r)/d log p = -A r where unclipped; 0 where the clipped term is the max
    torch.testing.assert_close(log_prob.grad, torch.tensor([0.0, -0.5, 1.5, 0.0], dtype=torch.float64) / 4)


class _Prompted(FlowMatchT2VPipeline):
    """The toy pipeline with a text encoder of prompt strings (as Wan's tokenizer gives): each word's
    letters as token ids, for ``negative_prompt``."""

    def encode_prompt(self, container, batch):
        if "prompt" not in batch:
            return super().encode_prompt(container, batch)
        ids = torch.tensor([[ord(c) % 32 for c in (p + "     ")[:5]] for p in batch["prompt"]])
        return super().encode_prompt(container, {"input_ids": ids})


def _grpo(toys, **options) -> tuple[FlowGRPO, torch.nn.Module]:
    torch.manual_seed(0)  # the toy modules initialise from the global generator: not from earlier tests'
    container = toys.DeclaredContainer(trainable=("predictor",))
    container.reference = copy.deepcopy(container.predictor)
    with torch.no_grad():  # the policy a little away from its reference: a KL term above 0
        container.predictor.conv.weight.add_(0.05)
    grpo = FlowGRPO(_Prompted(FlowMatchScheduler()), **{"group_size": 3, "sampling_steps": 4, **options})
    grpo.scorer = lambda latents, prompts, groups, names: (
        latents.double().flatten(1).mean(1),
        {"reward": 0.0},
    )
    return grpo, container


def _prompts(toys, ids: list[int]) -> dict:
    batch = toys.make_batch(batch_size=4)
    return {k: v[ids] for k, v in batch.items()}


def test_rollouts_and_loss_are_the_same_whatever_micro_batches_the_prompts_are_split_into(toys):
    """Prompts 5 and 9 of step 3 in one micro-batch (one rank), or one each (two ranks): the same clips,
    log-probabilities and loss (the mean of the two halves'); another step draws other clips."""
    grpo, container = _grpo(toys)
    batch = _prompts(toys, [0, 1])
    conditions = grpo.base.prepare_conditions(container, batch)
    shape = tuple(conditions["latents"].shape[1:])
    texts = {"prompt_embeds": conditions["prompt_embeds"].repeat_interleave(3, dim=0)}

    def rollout(ids, rows, step=3):
        part = {"prompt_embeds": texts["prompt_embeds"][rows]}
        return grpo.rollout(container, part, SampleRNG(seed=1, step=step, sample_ids=ids), shape)

    both = rollout([5, 9], slice(0, 6))
    halves = [rollout([5], slice(0, 3)), rollout([9], slice(3, 6))]
    torch.testing.assert_close(both.states, torch.cat([h.states for h in halves], dim=1), rtol=0, atol=1e-6)
    torch.testing.assert_close(
        both.log_probs, torch.cat([h.log_probs for h in halves], dim=1), rtol=0, atol=1e-6
    )
    assert not torch.allclose(both.samples[0], both.samples[1])  # group index 0 and 1 of a prompt differ
    assert not torch.allclose(rollout([5, 9], slice(0, 6), step=4).samples, both.samples)

    def loss(ids, rows):
        rng = SampleRNG(seed=1, step=3, sample_ids=ids)
        return grpo(container, rng=rng, phase="grpo", **_prompts(toys, rows))

    joint, parts = loss([5, 9], [0, 1]), [loss([5], [0]), loss([9], [1])]
    assert joint.loss.item() == pytest.approx(
        (parts[0].loss.item() + parts[1].loss.item()) / 2, abs=1e-7
    )  # fp32
    assert joint.logged["grpo_kl"] > 0


def test_each_optimizer_step_trains_the_keyed_fraction_of_the_sampler_steps(toys):
    grpo, _ = _grpo(toys, timestep_fraction=0.6)
    assert grpo.trained_steps == 2  # floor(0.6 * 4)
    steps = grpo.train_steps(SampleRNG(seed=1, step=3, sample_ids=[5, 9]))
    assert steps == grpo.train_steps(
        SampleRNG(seed=1, step=3, sample_ids=[0])
    )  # the step's, not the samples'
    assert len(steps) == 2 and all(0 <= k < 4 for k in steps)
    assert {tuple(grpo.train_steps(SampleRNG(seed=1, step=s, sample_ids=[0]))) for s in range(8)} != {
        tuple(steps)
    }


def test_the_updates_after_a_rollout_train_on_it_again_with_a_ratio_away_from_one_and_the_clip_binding(toys):
    """``updates_per_rollout=2``: step 4 rolls out and scores its prompts (ratio 1: the policy rolled out),
    step 5 trains on step 4's rollout after an optimizer step (its own batch unused, no scoring): its ratio
    departs from 1 and the clip binds; a process that did not roll out step 4 refuses step 5."""
    grpo, container = _grpo(toys, updates_per_rollout=2, clip_range=1e-4)
    scored = []
    scorer = grpo.scorer
    grpo.scorer = lambda *args, **kw: scored.append(1) or scorer(*args, **kw)
    optimizer = torch.optim.SGD(container.predictor.parameters(), lr=0.5)

    def update(step: int, rows: list[int]):
        rng = SampleRNG(seed=1, step=step, sample_ids=[2 * step, 2 * step + 1])
        out = grpo(container, rng=rng, phase="grpo", **_prompts(toys, rows))
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        return out.logged

    first, second = update(4, [0, 1]), update(5, [2, 3])
    assert len(scored) == 1 and "reward" in first and "reward" not in second
    assert first["grpo_ratio_deviation"] < 1e-5 and first["grpo_clip_fraction"] == 0.0
    assert second["grpo_ratio_deviation"] > 1e-3 and second["grpo_clip_fraction"] > 0.0
    resumed, _ = _grpo(toys, updates_per_rollout=2)
    with pytest.raises(
        ValueError, match=r"optimizer step 6 trains on the rollouts of step 5 .* resumes only"
    ):
        resumed(
            container,
            rng=SampleRNG(seed=1, step=5, sample_ids=[0, 1]),
            phase="grpo",
            **_prompts(toys, [0, 1]),
        )


@pytest.mark.parametrize("scale", ["group_std", "none"])
def test_the_advantages_a_step_trains_on_are_scaled_as_advantage_scale_says(toys, scale):
    grpo, container = _grpo(toys, advantage_scale=scale)
    grpo(container, rng=SampleRNG(seed=1, step=3, sample_ids=[5, 9]), phase="grpo", **_prompts(toys, [0, 1]))
    kept = grpo.kept[0]
    rewards = kept.rollout.samples["latents"].double().flatten(1).mean(1).reshape(2, 3)  # the scorer's
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if scale == "group_std":
        centred = centred / (rewards.std(dim=1, unbiased=False, keepdim=True) + 1e-4)
    torch.testing.assert_close(kept.advantages, centred.reshape(-1))


def test_bad_options_and_a_call_outside_the_phase_are_refused(toys):
    base = FlowMatchT2VPipeline(FlowMatchScheduler())
    with pytest.raises(
        ValueError, match=r"group_size must be >= 2 .*; timestep_fraction must lie in \(0, 1\]"
    ):
        FlowGRPO(base, group_size=1, timestep_fraction=0)
    with pytest.raises(
        ValueError, match=r"advantage_scale must be one of \('group_std', 'none'\), got 'batch'"
    ):
        FlowGRPO(base, advantage_scale="batch")
    grpo, container = _grpo(toys)
    with pytest.raises(ValueError, match="runs in the phase 'grpo'"):
        grpo(container, rng=SampleRNG.for_batch(2), phase="dpo", **_prompts(toys, [0, 1]))


def _observe(toys, **options) -> dict[str, torch.Tensor]:
    """One ``grpo`` step of prompts 5 and 9 (step 3) with ``options``: the clips the scorer got, the loss and
    the policy's gradient. The scorer nudges the policy after the rollout (as a later update of the same
    rollout would): the importance ratio leaves 1, so the clip range binds."""
    grpo, container = _grpo(toys, **options)
    seen = []

    def scorer(latents, prompts, groups, names):
        seen.append(latents.clone())
        with torch.no_grad():
            container.predictor.conv.bias.add_(0.02)
        return latents.double().flatten(1).mean(1), {}

    grpo.scorer = scorer
    batch = {
        **_prompts(toys, [0, 1]),
        "negative_prompt_embeds": torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(7)),
    }
    if options.get("negative_prompt") is not None:
        batch.pop("negative_prompt_embeds")  # encoded from the key, through the text encoder
    out = grpo(container, rng=SampleRNG(seed=1, step=3, sample_ids=[5, 9]), phase="grpo", **batch)
    out.loss.backward()
    return {
        "clips": seen[0],
        "loss": out.loss.detach(),
        "gradient": container.predictor.conv.weight.grad.clone(),
    }


# Each key of model.pipeline.grpo, a changed value, and what it acts on: the rollout's clips (their number
# or content) or only the update (the loss, its gradient), which then leaves the clips as they were.
KEYS = [
    ("group_size", 2, "clips"),
    ("noise_level", 1.2, "clips"),
    ("sampling_steps", 6, "clips"),
    ("shift", 1.0, "clips"),
    ("guidance_scale", 3.0, "clips"),
    ("clip_range", 0.5, "gradient"),
    ("advantage_clip", 0.5, "gradient"),
    ("kl_weight", 0.5, "loss"),
    ("timestep_fraction", 1.0, "loss"),
]


@pytest.mark.parametrize(("key", "value", "acts_on"), KEYS, ids=[k for k, _, _ in KEYS])
def test_each_grpo_key_changes_what_it_acts_on(toys, key, value, acts_on):
    default, again, changed = _observe(toys), _observe(toys), _observe(toys, **{key: value})
    for name in ("clips", "loss", "gradient"):  # the same options: the same step, exactly
        torch.testing.assert_close(again[name], default[name], rtol=0, atol=0)
    if acts_on == "clips":
        assert changed["clips"].shape != default["clips"].shape or not torch.allclose(
            changed["clips"], default["clips"], atol=1e-4
        ), key
    else:
        torch.testing.assert_close(
            changed["clips"], default["clips"], rtol=0, atol=0
        )  # the rollout as it was
        assert not torch.allclose(changed[acts_on], default[acts_on], rtol=1e-3, atol=1e-7), key
    if key == "group_size":
        assert changed["clips"].shape[0] == 2 * value  # 2 prompts x group_size clips


def test_the_negative_prompt_is_the_unconditional_text_of_the_guidance(toys):
    """Without ``negative_prompt_embeds`` in the batch the text encoder encodes ``negative_prompt``: another
    prompt, other guided clips."""
    guided = [_observe(toys, guidance_scale=3.0, negative_prompt=p)["clips"] for p in ("", "blurry", "")]
    torch.testing.assert_close(guided[2], guided[0], rtol=0, atol=0)
    assert not torch.allclose(guided[1], guided[0], atol=1e-4)
