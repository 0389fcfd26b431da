"""A packed Wan training step (samples of different shapes in one micro-batch) gives every sample the loss
it has in an unpacked step: the same keyed draws for the same sample id, each sample predicted alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from mm_pipelines import SampleRNG
from mm_trainer.model.features import apply_features
from torch._dynamo.utils import counters
from wan22_train.model import WanDiTConfig
from wan22_train.pipeline import Wan22Pipeline
from wan22_train.predictor import WanPredictor
from wan22_train.tiny import tiny_vae
from wan22_train.vae import WanVideoVAE

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


#: Clips [F, H, W] through the tiny VAE (x2 in time and space): latents [3, 8, 12], [5, 6, 10], [3, 4, 6] and,
#: for i2v only (ti2v leaves its one frame, the condition, out of the loss), an image's [1, 8, 12].
CLIPS = [(5, 16, 24), (9, 12, 20), (5, 8, 12), (1, 16, 24)]
CONDITIONED = {"i2v": {"in_dim": 3 * 4, "clips": CLIPS}, "ti2v": {"in_dim": 4, "clips": CLIPS[:3]}}


def conditioned_container(in_dim: int) -> SimpleNamespace:
    """The tiny VAE (4 latent channels) and a predictor of ``in_dim`` input channels (i2v: noise + mask + image
    latents), every weight live."""
    torch.manual_seed(0)
    predictor = WanPredictor(WanDiTConfig(**{**CONFIG, "in_dim": in_dim, "out_dim": 4}))
    with torch.no_grad():
        for p in predictor.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return SimpleNamespace(predictor=predictor, ae=WanVideoVAE(tiny_vae()))


@pytest.mark.parametrize("task", ["i2v", "ti2v"])
def test_a_packed_step_gives_every_sample_of_a_conditioned_task_its_unpacked_loss(task):
    """i2v: each sample's mask and first-frame latents (the VAE on its own first frame) on its channels;
    ti2v: its clean first latent frame at timestep 0 on its tokens, left out of its loss."""
    model = conditioned_container(CONDITIONED[task]["in_dim"])
    pipeline = Wan22Pipeline.from_options({"task": task, "expert": "all"})
    gen = torch.Generator().manual_seed(5)
    clips = CONDITIONED[task]["clips"]
    videos = [torch.rand(3, *shape, generator=gen) * 2 - 1 for shape in clips]
    texts = [torch.randn(n, 24, generator=gen) for n in TEXT_LENS[: len(clips)]]
    ids = SAMPLE_IDS[: len(clips)]
    conditions = pipeline.prepare_conditions(model, {"video": videos, "prompt_embeds": texts})
    noised = pipeline.noising(conditions, rng(ids))
    packed = pipeline.per_sample_loss(pipeline.predict(model, noised), noised)
    alone = torch.stack([
        pipeline(model, rng([i]), video=v[None], prompt_embeds=t[None]).loss
        for v, t, i in zip(videos, texts, ids, strict=True)
    ])  # fmt: skip
    assert len(set(noised["indices"].tolist())) == len(clips)
    assert alone.min() > 1e-3
    assert ((packed - alone).abs() / alone).max() <= 1e-5
    output = pipeline(model, rng(ids), video=videos, prompt_embeds=texts)
    torch.testing.assert_close(output.loss, alone.mean(), rtol=1e-5, atol=0)


#: Three micro-batches of different mixes (87, 36 and 27 tokens; 11, 14 and 13 text tokens).
PACKINGS = [(0, 1), (2, 3), (1, 2)]


def test_compiled_blocks_train_packed_steps_as_eager_ones_compiling_twice_for_any_number_of_packings():
    """``features.compile`` of the blocks (the trainer's ``apply_features``; ``aot_eager``: dynamo and AOT
    autograd, what inductor compiles from) with packing: each packing's loss and gradients are the eager
    ones, and after the second packing (the token counts turn dynamic) a new packing compiles nothing (the
    packed attentions run outside the graphs)."""
    torch._dynamo.reset()
    counters.clear()
    eager, compiled = container().predictor, container().predictor
    apply_features(compiled, compile_modules=["blocks.{*}"], compile_backend="aot_eager")
    pipeline = Wan22Pipeline.from_options({"task": "t2v", "expert": "all"})
    latents, texts = samples()
    graphs = []
    for step, picked in enumerate(PACKINGS):
        batch = {"latents": [latents[i] for i in picked], "prompt_embeds": [texts[i] for i in picked]}
        ids = [SAMPLE_IDS[i] for i in picked]
        results = []
        for model in (eager, compiled):
            model.zero_grad()
            loss = pipeline(
                SimpleNamespace(predictor=model), SampleRNG(seed=11, step=step, sample_ids=ids), **batch
            ).loss
            loss.backward()
            results.append((loss.detach(), [p.grad for p in model.parameters()]))
        (eager_loss, eager_grads), (compiled_loss, compiled_grads) = results
        torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=0)
        for got, want in zip(compiled_grads, eager_grads, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * want.abs().max().item())
        graphs.append(counters["stats"]["unique_graphs"])
    torch._dynamo.reset()
    assert 0 < graphs[0] < graphs[1] == graphs[2]
