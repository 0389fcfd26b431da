"""FlowMatchT2VPipeline with toy sub-models: loss, gradients, conditioning and metrics."""

from __future__ import annotations

import math

import pytest
import torch
from mm_pipelines import FlowMatchScheduler, FlowMatchT2VPipeline, SampleRNG


def keys(seed: int = 0, batch_size: int = 2) -> SampleRNG:
    return SampleRNG.for_batch(batch_size, seed=seed)


def test_t2v_forward_returns_a_finite_scalar_loss(toys, batch) -> None:
    out = FlowMatchT2VPipeline(FlowMatchScheduler())(toys.Container(), rng=keys(), **batch)
    assert out.loss.ndim == 0 and out.loss.dtype == torch.float32 and torch.isfinite(out.loss)


def test_backprop_reaches_only_the_predictor(toys, batch) -> None:
    container = toys.DeclaredContainer(trainable=("predictor",))
    FlowMatchT2VPipeline(FlowMatchScheduler())(container, rng=keys(), **batch).loss.backward()
    assert all(p.grad is not None for p in container.predictor.parameters())
    frozen = [*container.ae.parameters(), *container.text_encoder.parameters()]
    assert all(p.requires_grad and p.grad is None for p in frozen)


def test_conditions_are_computed_without_grad_unless_trainable(toys, batch) -> None:
    pipe = FlowMatchT2VPipeline(FlowMatchScheduler())
    frozen = pipe.prepare_conditions(toys.DeclaredContainer(trainable=("predictor",)), batch)
    assert not frozen["latents"].requires_grad and not frozen["prompt_embeds"].requires_grad
    trained = pipe.prepare_conditions(toys.DeclaredContainer(trainable=("predictor", "text_encoder")), batch)
    assert trained["prompt_embeds"].requires_grad and not trained["latents"].requires_grad


def test_padding_tokens_get_zero_embeddings(toys, batch) -> None:
    embeds = FlowMatchT2VPipeline(FlowMatchScheduler()).encode_prompt(toys.Container(), batch)
    assert embeds.shape == (2, 5, 8)
    assert torch.all(embeds[:, -2:] == 0) and torch.all(embeds[:, :3].abs().sum(-1) > 0)


def test_noised_inputs_target_and_loss_follow_the_formulas(toys, batch) -> None:
    pipe = FlowMatchT2VPipeline(FlowMatchScheduler())
    container = toys.Container()
    conditions = pipe.prepare_conditions(container, batch)
    noised = pipe.noising(conditions, keys(3))
    x0, x_t, t = conditions["latents"], noised["hidden_states"], noised["timestep"]
    sigma = (t / 1000).reshape(-1, 1, 1, 1, 1)
    noise = (x_t - (1 - sigma) * x0) / sigma
    torch.testing.assert_close(noised["target"], noise - x0, rtol=1e-4, atol=1e-4)
    ts = [1000 * (3 * s / (1 + 2 * s)) for s in (1 + (0.003 / 1.002 - 1) * i / 999 for i in range(1000))]
    y = [math.exp(-2 * ((v - 500) / 1000) ** 2) for v in ts]
    w = torch.tensor(
        [
            (math.exp(-2 * ((v - 500) / 1000) ** 2) - min(y)) * 1000 / sum(v - min(y) for v in y)
            for v in t.tolist()
        ]
    )
    pred = pipe.predict(container, noised)
    expected = (w * (pred.float() - noised["target"]).pow(2).flatten(1).mean(1)).mean()
    torch.testing.assert_close(pipe.compute_loss(pred, noised), expected, rtol=1e-4, atol=1e-7)


def test_weighting_off_gives_plain_mse(toys, batch) -> None:
    pipe = FlowMatchT2VPipeline(FlowMatchScheduler(weighting=False))
    container = toys.Container()
    noised = pipe.noising(pipe.prepare_conditions(container, batch), keys())
    pred = pipe.predict(container, noised)
    torch.testing.assert_close(pipe.compute_loss(pred, noised), (pred - noised["target"]).pow(2).mean())


def test_same_generator_seed_gives_the_same_loss(toys, batch) -> None:
    pipe, container = FlowMatchT2VPipeline(FlowMatchScheduler()), toys.Container()
    assert torch.equal(pipe(container, rng=keys(5), **batch).loss, pipe(container, rng=keys(5), **batch).loss)


def test_precomputed_latents_and_prompt_embeds_skip_the_encoders(toys) -> None:
    container = toys.Container()
    del container.ae, container.text_encoder
    batch = {"latents": torch.randn(2, 4, 3, 4, 4), "prompt_embeds": torch.randn(2, 5, 8)}
    out = FlowMatchT2VPipeline(FlowMatchScheduler())(container, rng=keys(), **batch)
    assert torch.isfinite(out.loss)


def test_missing_batch_keys_are_named(toys) -> None:
    with pytest.raises(KeyError, match=r"'video' or 'latents'.*\['input_ids'\]"):
        FlowMatchT2VPipeline(FlowMatchScheduler())(
            toys.Container(), input_ids=torch.zeros(1, 2, dtype=torch.long)
        )


def test_num_tokens_defaults_to_latent_positions(toys, batch) -> None:
    out = FlowMatchT2VPipeline(FlowMatchScheduler())(toys.Container(), rng=keys(), **batch)
    # 9 frames -> 3 latent frames, 8x8 -> 4x4.
    assert out.metrics == {"num_samples": 2.0, "num_tokens": 2.0 * 3 * 4 * 4}


def test_num_tokens_uses_the_predictor_count_when_exposed(toys, batch) -> None:
    container = toys.Container()
    seen = []
    container.predictor.tokens_per_sample = lambda shape: (
        seen.append(shape) or shape[1] * shape[2] * shape[3] // 4
    )
    out = FlowMatchT2VPipeline(FlowMatchScheduler())(container, rng=keys(), **batch)
    assert seen == [(4, 3, 4, 4)] and out.metrics["num_tokens"] == 2.0 * 12


def test_rejects_unknown_task() -> None:
    with pytest.raises(ValueError, match="task='v2v'"):
        FlowMatchT2VPipeline(FlowMatchScheduler(), task="v2v")


def test_spaced_indices_are_the_middles_of_equal_parts_of_the_trained_range() -> None:
    assert FlowMatchScheduler().spaced_indices(4).tolist() == [125, 375, 625, 875]
    high = FlowMatchScheduler(max_boundary=0.417)  # an A14B high-noise expert's range [0, 417)
    assert high.spaced_indices(2).tolist() == [104, 312]


def test_validation_loss_is_the_per_sample_training_loss_averaged_over_the_fixed_timesteps(
    toys, batch
) -> None:
    pipe, container = FlowMatchT2VPipeline(FlowMatchScheduler()), toys.Container()
    rng = SampleRNG(seed=7, step=0, sample_ids=[10, 11])
    conditions = pipe.prepare_conditions(container, batch)
    expected = torch.zeros(2)
    for index in (250, 750):
        noised = pipe.noising(conditions, rng, indices=torch.tensor([index, index]))
        pred = pipe.predict(container, noised)
        expected += noised["weight"] * (pred - noised["target"]).pow(2).flatten(1).mean(1) / 2
    torch.testing.assert_close(pipe.validation_loss(container, batch, rng, 2), expected)


def test_validation_loss_of_a_sample_depends_on_its_key_not_on_its_batch(toys, batch) -> None:
    pipe, container = FlowMatchT2VPipeline(FlowMatchScheduler()), toys.Container()
    both = pipe.validation_loss(container, batch, SampleRNG(seed=7, step=0, sample_ids=[10, 11]), 3)
    second = {k: v[1:] for k, v in batch.items()}
    alone = pipe.validation_loss(container, second, SampleRNG(seed=7, step=0, sample_ids=[11]), 3)
    torch.testing.assert_close(alone, both[1:])
