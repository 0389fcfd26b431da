"""A packed Wan training step (samples of different shapes in one micro-batch) gives every sample the loss
it has in an unpacked step: the same keyed draws for the same sample id, each sample predicted alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from mm_pipelines import SampleRNG
from wan22_train.model import WanDiTConfig
from wan22_train.pipeline import Wan22Pipeline
from wan22_train.predictor import WanPredictor

CONFIG = dict(
    model_type="t2v", patch_size=(1, 2, 2), in_dim=16, dim=64, ffn_dim=96, freq_dim=32, text_dim=24,
    out_dim=16, num_heads=4, num_layers=2, qk_norm=True, cross_attn_norm=True, eps=1e-6, rope_max_seq_len=64,
)  # fmt: skip
SHAPES = [(3, 8, 12), (1, 6, 10), (2, 4, 6), (1, 8, 12)]  # latent [T, h, w]: three videos and an image
TEXT_LENS = [7, 4, 9, 5]
SAMPLE_IDS = [40, 3, 17, 8]


def container(seed: int = 0) -> SimpleNamespace:
    torch.manual_seed(seed)
    predictor = WanPredictor(WanDiTConfig(**CONFIG))
    with torch.no_grad():
        for p in predictor.parameters():
            p.add_(0.1 * torch.randn_like(p))  # the Wan head starts at zero: make every output live
    return SimpleNamespace(predictor=predictor)


def samples():
    gen = torch.Generator().manual_seed(7)
    latents = [torch.randn(16, *shape, generator=gen) for shape in SHAPES]
    texts = [torch.randn(n, 24, generator=gen) for n in TEXT_LENS]
    return latents, texts


def rng(ids) -> SampleRNG:
    return SampleRNG(seed=11, step=0, sample_ids=ids)


def test_packed_per_sample_losses_equal_each_samples_unpacked_loss():
    model, pipeline = container(), Wan22Pipeline.from_options({"task": "t2v", "expert": "all"})
    latents, texts = samples()
    conditions = {"latents": latents, "prompt_embeds": texts}
    noised = pipeline.noising(conditions, rng(SAMPLE_IDS))
    packed = pipeline.per_sample_loss(pipeline.predict(model, noised), noised)
    alone = []
    for z, text, sample_id in zip(latents, texts, SAMPLE_IDS, strict=True):
        one = pipeline.noising({"latents": z[None], "prompt_embeds": text[None]}, rng([sample_id]))
        alone.append(pipeline.per_sample_loss(pipeline.predict(model, one), one)[0])
    alone = torch.stack(alone)
    assert len(set(noised["indices"].tolist())) == len(SHAPES)  # each sample its own timestep
    assert alone.min() > 1e-3
    assert ((packed - alone).abs() / alone).max() <= 1e-5
    # the whole step: its loss and gradients are those of the samples alone
    output = pipeline(model, rng(SAMPLE_IDS), latents=latents, prompt_embeds=texts)
    torch.testing.assert_close(output.loss, alone.mean(), rtol=1e-5, atol=0)
    assert output.metrics["num_samples"] == 4
    assert output.metrics["num_tokens"] == sum(t * (h // 2) * (w // 2) for t, h, w in SHAPES)


def test_a_samples_draws_do_not_depend_on_its_packing():
    pipeline = Wan22Pipeline.from_options({"task": "t2v", "expert": "high_noise"})
    latents, texts = samples()
    packed = pipeline.noising({"latents": latents, "prompt_embeds": texts}, rng(SAMPLE_IDS))
    reordered = pipeline.noising(
        {"latents": latents[::-1], "prompt_embeds": texts[::-1]}, rng(SAMPLE_IDS[::-1])
    )
    for i in range(len(SHAPES)):
        torch.testing.assert_close(
            packed["hidden_states"][i], reordered["hidden_states"][-1 - i], rtol=0, atol=0
        )
        assert packed["indices"][i] == reordered["indices"][-1 - i]


def test_packing_is_refused_for_tasks_with_per_shape_conditions():
    pipeline = Wan22Pipeline.from_options({"task": "i2v", "expert": "high_noise"})
    latents, texts = samples()
    with pytest.raises(ValueError, match="task t2v only, this pipeline's task is 'i2v'"):
        pipeline.noising({"latents": latents, "prompt_embeds": texts}, rng(SAMPLE_IDS))
