"""Flow-GRPO's rollouts under each prompt's conditions, as the Wan samplers take them: classifier-free
guidance (the rollout's and the trained step's velocity alike), the i2v channel condition at every step,
and the ti2v clean first frame kept at every state."""

from __future__ import annotations

import pytest
import torch
from mm_pipelines import (
    FlowGRPO,
    FlowMatchScheduler,
    FlowMatchT2VPipeline,
    SampleRNG,
    i2v_condition,
    sde_rollout,
)

RNG = SampleRNG(seed=1, step=3, sample_ids=[5, 9])


def _by_latents(latents, prompts, groups, names):
    return latents.double().flatten(1).mean(1), {}


def _setup(toys, task: str = "t2v", **options):
    torch.manual_seed(0)
    container = toys.Container(predictor_in=12 if task == "i2v" else None)
    base = FlowMatchT2VPipeline(FlowMatchScheduler(), task=task)
    grpo = FlowGRPO(base, group_size=2, sampling_steps=4, kl_weight=0, **options)
    grpo.scorer = _by_latents
    batch = toys.make_batch(batch_size=2)
    return grpo, container, batch, base.prepare_conditions(container, batch)


def _recorded_inputs(predictor: torch.nn.Module) -> list[torch.Tensor]:
    inputs: list[torch.Tensor] = []
    predictor.register_forward_hook(lambda _, args, __: inputs.append(args[0].detach().clone()))
    return inputs


def test_a_guided_rollout_and_its_trained_steps_log_prob_take_the_hand_combined_velocity(toys):
    grpo, container, batch, conditions = _setup(toys, guidance_scale=4.0, clip_range=1e-5)
    negative = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(2))
    batch["negative_prompt_embeds"] = negative
    clip = grpo.clip_conditions(container, batch, conditions)
    shape = tuple(conditions["latents"].shape[1:])
    rollout = grpo.rollout(container, clip, RNG, shape)

    texts, negatives = clip["prompt_embeds"], negative.repeat_interleave(2, dim=0)

    def by_hand(x, sigma, k):
        v_c = container.predictor(x, sigma * 1000, texts)
        v_u = container.predictor(x, sigma * 1000, negatives)
        return v_u + 4.0 * (v_c - v_u)

    def keyed(purpose):
        draws = [RNG.randn(f"{purpose}_{g}", shape) for g in range(2)]
        return torch.stack(draws, dim=1).flatten(0, 1)

    want = sde_rollout(by_hand, keyed("grpo_start"), lambda k: keyed(f"grpo_step_{k}"), grpo.sigmas, 0.7)
    torch.testing.assert_close(rollout.states, want.states, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rollout.log_probs, want.log_probs, rtol=1e-5, atol=1e-5)
    unguided = sde_rollout(
        lambda x, s, k: container.predictor(x, s * 1000, texts), keyed("grpo_start"),
        lambda k: keyed(f"grpo_step_{k}"), grpo.sigmas, 0.7,
    )  # fmt: skip
    assert (unguided.samples - want.samples).abs().max() > 1e-2  # the guidance matters here
    # The trained steps' log-probabilities are the rollout's (the same guided velocity): every ratio within
    # 1e-5 of 1; with the conditional velocity alone they would be far off.
    out = grpo(container, rng=RNG, phase="grpo", **batch)
    assert out.logged["grpo_clip_fraction"] == 0.0


def test_guidance_is_refused_by_a_pipeline_without_unconditional_conditions():
    class NoUnconditional(FlowMatchT2VPipeline):
        unconditional = None

    with pytest.raises(ValueError, match=r"grpo.guidance_scale=2.0: NoUnconditional has no unconditional"):
        FlowGRPO(NoUnconditional(FlowMatchScheduler()), guidance_scale=2.0)
    FlowGRPO(NoUnconditional(FlowMatchScheduler()))  # no guidance: no unconditional needed


def test_an_i2v_rollout_gives_the_predictor_each_prompts_mask_and_first_frame_latents_at_every_step(toys):
    """Wan2.2 I2V A14B's sampler: ``cat([x_t, mask, image_latents])`` at every step, the latents' first
    frame sampled like the others; here in the rollout and in the trained steps."""
    grpo, container, batch, conditions = _setup(toys, "i2v", timestep_fraction=1.0)
    inputs = _recorded_inputs(container.predictor)
    out = grpo(container, rng=RNG, phase="grpo", **batch)
    image_latents = grpo.base.encode_image_latents(container, batch)
    want = i2v_condition(conditions["latents"], image_latents).repeat_interleave(2, dim=0)
    assert len(inputs) == 4 + 4  # 4 rollout steps, 4 trained steps
    for hidden in inputs:
        assert hidden.shape[1] == 12
        torch.testing.assert_close(hidden[:, 4:], want, rtol=0, atol=0)
    assert torch.isfinite(out.loss)


def test_a_ti2v_rollout_keeps_each_prompts_clean_first_frame_at_every_state_and_scores_the_whole_clip(toys):
    """Wan2.2 TI2V-5B's sampler: the first latent frame is the clean image latents at every step; only the
    later frames are sampled (their transitions alone make the log-probabilities)."""
    grpo, container, batch, conditions = _setup(toys, "ti2v")
    first = conditions["latents"][:, :, :1].repeat_interleave(2, dim=0)
    inputs, scored = _recorded_inputs(container.predictor), []
    grpo.scorer = lambda latents, *a, **k: (scored.append(latents), _by_latents(latents, *a, **k))[1]
    grpo(container, rng=RNG, phase="grpo", **batch)
    frames = conditions["latents"].shape[2]
    (clips,) = scored
    assert clips.shape[2] == frames and not torch.allclose(clips[:, :, 1:2], first)
    torch.testing.assert_close(clips[:, :, :1], first, rtol=0, atol=0)
    assert len(inputs) == 4 + grpo.trained_steps
    for hidden in inputs:  # the predictor sees the clean frame first at every state, rollout and update
        torch.testing.assert_close(hidden[:, :, :1], first, rtol=0, atol=0)
    rollout = grpo.rollout(
        container,
        grpo.clip_conditions(container, batch, conditions),
        RNG,
        tuple(conditions["latents"].shape[1:]),
    )
    assert rollout.states.shape[3] == frames - 1  # [K + 1, N, c, T - 1, h, w]: the sampled frames only
