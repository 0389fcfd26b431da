"""LTX-2 flow matching: noising, conditioning, targets and loss from their definitions."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from ltx2_train.pipeline import (
    LTX2Pipeline,
    first_frame_token_mask,
    masked_mse,
    pack_audio,
    pack_video,
    unpack_video,
)
from ltx2_train.timesteps import SigmaSampler
from mm_pipelines import SampleRNG


def conditions(batch: int = 3, grid=(3, 2, 2), channels: int = 4, audio_len: int = 5):
    g = torch.Generator().manual_seed(0)
    f, h, w = grid
    return {
        "video": torch.randn(batch, f * h * w, channels, generator=g),
        "audio": torch.randn(batch, audio_len, 6, generator=g),
        "grid": grid,
    }


def test_video_and_audio_share_one_sigma_and_mix_as_one_minus_sigma_x0_plus_sigma_eps():
    pipe = LTX2Pipeline(SigmaSampler(), audio=True)
    cond = conditions()
    noised = pipe.noising(cond, SampleRNG.for_batch(3, seed=5))
    # Recover eps from the targets (target = eps - x0) and check the mixture with the SAME sigma.
    sigma = noised["sigma"][:, None, None]
    eps_v = noised["video_target"] + cond["video"]
    eps_a = noised["audio_target"] + cond["audio"]
    torch.testing.assert_close(noised["noisy_video"], (1 - sigma) * cond["video"] + sigma * eps_v)
    torch.testing.assert_close(noised["noisy_audio"], (1 - sigma) * cond["audio"] + sigma * eps_a)
    assert noised["video_timestep"].shape == (3,)  # no conditioning: one timestep per sample


def test_shared_audio_timesteps_give_the_audio_the_videos_sigma():
    noised = LTX2Pipeline(SigmaSampler(), audio_timesteps="shared").noising(
        conditions(), SampleRNG.for_batch(3, seed=5)
    )
    assert torch.equal(noised["audio_sigma"], noised["sigma"])


def test_independent_audio_timesteps_draw_each_samples_audio_sigma_apart_and_noise_the_audio_at_it():
    cond, keys = conditions(), SampleRNG.for_batch(3, seed=5)
    shared = LTX2Pipeline(SigmaSampler(), audio_timesteps="shared").noising(cond, keys)
    noised = LTX2Pipeline(SigmaSampler(), audio_timesteps="independent").noising(cond, keys)
    assert torch.equal(noised["sigma"], shared["sigma"])  # the video's draw is unchanged
    assert (noised["audio_sigma"] != noised["sigma"]).all(), (noised["audio_sigma"], noised["sigma"])
    want = torch.cat(
        [SigmaSampler().sample(1, 12, generator=g) for g in keys.sample_generators("audio_sigma")]
    )
    torch.testing.assert_close(noised["audio_sigma"], want)
    sa = noised["audio_sigma"][:, None, None]
    eps_a = noised["audio_target"] + cond["audio"]
    torch.testing.assert_close(noised["noisy_audio"], (1 - sa) * cond["audio"] + sa * eps_a)


def test_the_transformer_gets_the_audio_sigma_as_its_audio_timestep(tiny_predictor):
    model = tiny_predictor()
    seen = {}
    model.register_forward_pre_hook(lambda _, args, kwargs: seen.update(kwargs), with_kwargs=True)
    pipe = LTX2Pipeline.from_options({"audio": True, "audio_timesteps": "independent"})
    batch = held_out_batch()
    pipe.forward(SimpleNamespace(model=model), SampleRNG.for_batch(2, seed=3), **batch)
    noised = pipe.noising(
        pipe.prepare_conditions(SimpleNamespace(model=model), batch), SampleRNG.for_batch(2, seed=3)
    )
    torch.testing.assert_close(seen["audio_timestep"], 1000 * noised["audio_sigma"])
    torch.testing.assert_close(seen["timestep"], 1000 * noised["sigma"])


@pytest.mark.parametrize(("frozen", "expected"), [("none", 4.0 + 0.5), ("audio", 4.0), ("video", 0.5)])
def test_the_frozen_modality_contributes_no_loss_but_both_losses_are_reported(frozen, expected):
    pipe = LTX2Pipeline(SigmaSampler(), audio_loss_weight=0.5, frozen_modality=frozen)
    noised = pipe.noising(conditions(), SampleRNG.for_batch(3, seed=2))
    loss = pipe.compute_loss((noised["video_target"] + 2.0, noised["audio_target"] + 1.0), noised)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert noised["video_loss"].item() == pytest.approx(4.0) and noised["audio_loss"].item() == pytest.approx(
        1.0
    )


def test_audio_only_training_without_audio_is_refused():
    with pytest.raises(ValueError, match="frozen_modality=video .* needs model.pipeline.audio: true"):
        LTX2Pipeline(audio=False, frozen_modality="video")


def test_sigma_follows_the_sampler_for_the_video_token_count():
    pipe = LTX2Pipeline(SigmaSampler(), audio=False)
    cond = conditions(batch=4, grid=(4, 16, 16))  # 1024 tokens
    keys = SampleRNG.for_batch(4, seed=9)
    got = pipe.noising(cond, keys)["sigma"]
    want = torch.cat([SigmaSampler().sample(1, 1024, generator=g) for g in keys.sample_generators("sigma")])
    torch.testing.assert_close(got, want)


def test_a_sample_is_noised_the_same_in_any_micro_batch():
    pipe = LTX2Pipeline(SigmaSampler(), audio=True, first_frame_conditioning_p=0.5)
    cond = conditions(batch=3)
    whole = pipe.noising(cond, SampleRNG(seed=1, step=4, sample_ids=[6, 7, 8]))
    for i in range(3):
        alone = {**cond, "video": cond["video"][i : i + 1], "audio": cond["audio"][i : i + 1]}
        one = pipe.noising(alone, SampleRNG(seed=1, step=4, sample_ids=[6 + i]))
        for key in ("sigma", "conditioned", "noisy_video", "noisy_audio"):
            assert torch.equal(whole[key][i : i + 1], one[key]), (key, i)


def test_first_frame_conditioning_keeps_the_first_latent_frame_clean_with_timestep_zero():
    pipe = LTX2Pipeline(SigmaSampler(), audio=True, first_frame_conditioning_p=1.0)
    cond = conditions(grid=(3, 2, 2))
    noised = pipe.noising(cond, SampleRNG.for_batch(3, seed=1))
    first = slice(0, 4)  # 2 x 2 tokens of latent frame 0
    assert noised["conditioned"][:, first].all() and not noised["conditioned"][:, 4:].any()
    torch.testing.assert_close(noised["noisy_video"][:, first], cond["video"][:, first])
    assert (noised["video_timestep"][:, first] == 0).all()
    torch.testing.assert_close(noised["video_timestep"][:, 4:], noised["sigma"][:, None].expand(-1, 8))


def test_video_extension_keeps_the_first_k_latent_frames_clean_with_timestep_zero():
    pipe = LTX2Pipeline(SigmaSampler(), audio=True, first_frame_conditioning_p=1.0, conditioning_frames=2)
    cond = conditions(grid=(3, 2, 2))
    noised = pipe.noising(cond, SampleRNG.for_batch(3, seed=1))
    first = slice(0, 8)  # 2 x 2 tokens of latent frames 0 and 1
    assert noised["conditioned"][:, first].all() and not noised["conditioned"][:, 8:].any()
    torch.testing.assert_close(noised["noisy_video"][:, first], cond["video"][:, first], rtol=0, atol=0)
    assert not torch.allclose(noised["noisy_video"][:, 8:], cond["video"][:, 8:])
    assert (noised["video_timestep"][:, first] == 0).all()
    torch.testing.assert_close(noised["video_timestep"][:, 8:], noised["sigma"][:, None].expand(-1, 4))


def test_video_extension_puts_no_loss_on_the_conditioning_frames():
    pipe = LTX2Pipeline(SigmaSampler(), audio=False, first_frame_conditioning_p=1.0, conditioning_frames=2)
    noised = pipe.noising(conditions(grid=(3, 2, 2)), SampleRNG.for_batch(3, seed=2))
    video = noised["video_target"].clone()
    video[:, :8] += 100.0  # error only on the 2 conditioning frames
    video[:, 8:] += 2.0
    assert pipe.compute_loss((video, None), noised).item() == pytest.approx(4.0, rel=1e-6)


def test_video_extension_of_a_clip_no_longer_than_its_conditioning_frames_is_refused(tiny_predictor):
    batch = {
        "latents": torch.randn(1, 8, 2, 4, 4),
        "prompt_embeds": torch.randn(1, 6, 32),
        "prompt_attention_mask": torch.ones(1, 6, dtype=torch.long),
    }
    pipe = LTX2Pipeline(audio=False, first_frame_conditioning_p=1.0, conditioning_frames=2)
    with pytest.raises(
        ValueError, match=r"2 latent frame\(s\) leave none to generate after .*conditioning_frames=2"
    ):
        pipe.prepare_conditions(SimpleNamespace(model=tiny_predictor()), batch)


def test_an_image_is_never_conditioned_on_its_only_frame_while_clips_are():
    """At a conditioning probability just below 1, every clip of the batch is conditioned and no one-frame
    sample (an image) is: its loss and timestep cover its every token."""
    pipe = LTX2Pipeline(SigmaSampler(), audio=False, first_frame_conditioning_p=0.999)
    keys = SampleRNG.for_batch(8, seed=4)
    assert pipe.noising(conditions(batch=8, grid=(3, 2, 2)), keys)["conditioned"][:, :4].all()
    image = pipe.noising(conditions(batch=8, grid=(1, 2, 2)), keys)
    assert not image["conditioned"].any()
    assert image["video_timestep"].shape == (8,)  # one timestep per sample: no token at 0
    assert pipe.compute_loss((image["video_target"] + 2.0, None), image).item() == pytest.approx(
        4.0, rel=1e-6
    )


def test_one_frame_samples_train_through_the_transformer_and_are_refused_only_when_every_sample_is_conditioned(
    tiny_predictor,
):
    g = torch.Generator().manual_seed(0)
    batch = {
        "latents": torch.randn(2, 8, 1, 4, 4, generator=g),  # two images: one latent frame each
        "prompt_embeds": torch.randn(2, 6, 32, generator=g),
        "prompt_attention_mask": torch.ones(2, 6, dtype=torch.long),
        "frame_rate": torch.tensor([24.0, 24.0]),
    }
    container = SimpleNamespace(model=tiny_predictor())
    out = LTX2Pipeline(audio=False, first_frame_conditioning_p=0.5).forward(
        container, SampleRNG.for_batch(2), **batch
    )
    assert torch.isfinite(out.loss) and out.loss.item() > 0 and out.metrics["num_tokens"] == 2 * 16
    out.loss.backward()
    assert container.model.proj_out.weight.grad.abs().sum() > 0
    with pytest.raises(
        ValueError, match=r"1 latent frame\(s\) leave none .* or first_frame_conditioning_p < 1"
    ):
        LTX2Pipeline(audio=False, first_frame_conditioning_p=1.0).prepare_conditions(container, batch)


def test_conditioning_probability_is_per_sample():
    mask = first_frame_token_mask(10_000, 2, 3, 0.3, generator=torch.Generator().manual_seed(0))
    chosen = mask[:, 0]
    assert chosen.float().mean().item() == pytest.approx(0.3, abs=0.015)
    assert torch.equal(mask[:, :3], chosen[:, None].expand(-1, 3)) and not mask[:, 3:].any()


def test_video_loss_ignores_conditioning_tokens_and_audio_loss_adds_with_its_weight():
    pipe = LTX2Pipeline(SigmaSampler(), audio=True, first_frame_conditioning_p=1.0, audio_loss_weight=0.5)
    noised = pipe.noising(conditions(grid=(3, 2, 2)), SampleRNG.for_batch(3, seed=2))
    video = noised["video_target"].clone()
    video[:, :4] += 100.0  # error only on conditioning tokens
    video[:, 4:] += 2.0  # squared error 4 elsewhere
    audio = noised["audio_target"] + 1.0  # squared error 1
    loss = pipe.compute_loss((video, audio), noised)
    assert loss.item() == pytest.approx(4.0 + 0.5 * 1.0, rel=1e-6)


def test_masked_mse_is_a_token_weighted_mean():
    pred, target = torch.zeros(1, 2, 3), torch.tensor([[[1.0, 1, 1], [3, 3, 3]]])
    assert masked_mse(pred, target).item() == pytest.approx(5.0)
    assert masked_mse(pred, target, torch.tensor([[False, True]])).item() == pytest.approx(9.0)


def test_packing_matches_upstream_ltx2_pipeline():
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline as Upstream

    video, audio = torch.randn(2, 4, 3, 2, 5), torch.randn(2, 4, 7, 3)
    torch.testing.assert_close(pack_video(video), Upstream._pack_latents(video, 1, 1))
    torch.testing.assert_close(pack_audio(audio), Upstream._pack_audio_latents(audio))


@pytest.mark.parametrize(("patch", "patch_t"), [(1, 1), (2, 1), (2, 3), (4, 6)])
def test_patched_packing_matches_upstream_and_unpacks_to_the_latents(patch, patch_t):
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline as Upstream

    video = torch.randn(2, 5, 6, 4, 8)  # [B, C, F, H, W]
    tokens = pack_video(video, patch, patch_t)
    assert tokens.shape == (2, (6 // patch_t) * (4 // patch) * (8 // patch), 5 * patch_t * patch * patch)
    torch.testing.assert_close(tokens, Upstream._pack_latents(video, patch, patch_t), rtol=0, atol=0)
    assert torch.equal(unpack_video(tokens, (6, 4, 8), patch, patch_t), video)


def test_a_latent_grid_the_patches_do_not_tile_is_refused():
    with pytest.raises(ValueError, match=r"latent grid .* \(5, 4, 8\) does not divide .*patch_size_t=2"):
        pack_video(torch.randn(1, 2, 5, 4, 8), 2, 2)
    with pytest.raises(ValueError, match=r"\(6, 4, 6\) .*patch_size=4"):
        unpack_video(torch.randn(1, 3, 8), (6, 4, 6), 4, 1)


def test_the_pipeline_packs_with_the_transformers_patch_and_refuses_first_frame_conditioning_across_frames():
    from ltx2_train.tiny import tiny_transformer

    model = tiny_transformer(patch_size=2, patch_size_t=3, in_channels=4 * 12, out_channels=4 * 12)
    batch = {
        "latents": torch.randn(1, 4, 3, 4, 4),
        "prompt_embeds": torch.randn(1, 6, 32),
        "prompt_attention_mask": torch.ones(1, 6, dtype=torch.long),
    }
    container = SimpleNamespace(model=model)
    cond = LTX2Pipeline(audio=False).prepare_conditions(container, batch)
    torch.testing.assert_close(cond["video"], pack_video(batch["latents"], 2, 3), rtol=0, atol=0)
    with pytest.raises(ValueError, match="first_frame_conditioning_p=0.1 .* patch_size_t is 3"):
        LTX2Pipeline(audio=False, first_frame_conditioning_p=0.1).prepare_conditions(container, batch)


def test_forward_runs_the_transformer_and_reports_tokens(tiny_predictor):
    model = tiny_predictor()
    container = SimpleNamespace(model=model)
    pipe = LTX2Pipeline.from_options({"audio": True, "first_frame_conditioning_p": 0.5})
    g = torch.Generator().manual_seed(0)
    batch = {
        "latents": torch.randn(2, 8, 2, 4, 4, generator=g),
        "audio_latents": torch.randn(2, 4, 6, 4, generator=g),
        "prompt_embeds": torch.randn(2, 6, 32, generator=g),
        "audio_prompt_embeds": torch.randn(2, 6, 32, generator=g),
        "prompt_attention_mask": torch.ones(2, 6, dtype=torch.long),
        "frame_rate": torch.tensor([8.0, 8.0]),
    }
    out = pipe.forward(container, SampleRNG.for_batch(2), **batch)
    assert torch.isfinite(out.loss) and out.loss.requires_grad
    assert out.metrics["num_tokens"] == 2 * (32 + 6) and out.metrics["num_samples"] == 2
    assert out.metrics["flops"] == 2 * model.training_flops(32, 6, 6)
    out.loss.backward()
    assert model.proj_out.weight.grad is not None and model.audio_proj_out.weight.grad is not None


def held_out_batch(size: int = 2) -> dict:
    g = torch.Generator().manual_seed(1)
    return {
        "latents": torch.randn(size, 8, 2, 4, 4, generator=g),
        "audio_latents": torch.randn(size, 4, 6, 4, generator=g),
        "prompt_embeds": torch.randn(size, 6, 32, generator=g),
        "prompt_attention_mask": torch.ones(size, 6, dtype=torch.long),
        "frame_rate": torch.full((size,), 8.0),
    }


def test_the_held_out_loss_is_the_training_loss_at_fixed_sigmas_with_the_samples_own_noise(tiny_predictor):
    """At ``n`` timesteps: the mean over sigmas ``(k + 1/2) / n`` of each sample's video MSE + weighted audio
    MSE against ``eps - x0``, ``eps`` drawn once per sample (purposes ``noise``, ``audio_noise``)."""
    container = SimpleNamespace(model=tiny_predictor())
    pipe = LTX2Pipeline.from_options({"audio": True, "audio_loss_weight": 0.5})
    batch, rng = held_out_batch(), SampleRNG(seed=3, step=0, sample_ids=[4, 9])
    got = pipe.validation_loss(container, batch, rng, 2)
    cond = pipe.prepare_conditions(container, batch)
    eps = rng.randn("noise", cond["video"].shape[1:])
    eps_a = rng.randn("audio_noise", cond["audio"].shape[1:])
    expected, expected_video, expected_audio = torch.zeros(2), torch.zeros(2), torch.zeros(2)
    with torch.no_grad():
        for sigma in (0.25, 0.75):
            s = torch.full((2,), sigma)
            noised = {**cond, "sigma": s, "video_timestep": s, "noisy_audio": (1 - sigma) * cond["audio"] + sigma * eps_a,
                      "noisy_video": (1 - sigma) * cond["video"] + sigma * eps}  # fmt: skip
            video, audio = pipe.predict(container, noised)
            video_mse = (video - (eps - cond["video"])).pow(2).mean(dim=(1, 2))
            audio_mse = (audio - (eps_a - cond["audio"])).pow(2).mean(dim=(1, 2))
            expected += (video_mse + 0.5 * audio_mse) / 2
            expected_video += video_mse / 2
            expected_audio += audio_mse / 2
    assert set(got) == {"loss", "loss_video", "loss_audio"}
    assert got["loss"].shape == (2,) and not got["loss"].requires_grad
    torch.testing.assert_close(got["loss"], expected)
    torch.testing.assert_close(
        got["loss_video"], expected_video
    )  # each stream's, unweighted: val_loss_<stream>
    torch.testing.assert_close(got["loss_audio"], expected_audio)


@pytest.mark.parametrize(("frozen", "trained"), [("audio", "loss_video"), ("video", "loss_audio")])
def test_the_held_out_loss_of_a_frozen_modality_run_leaves_the_frozen_stream_out_as_training_does(
    tiny_predictor, frozen, trained
):
    container = SimpleNamespace(model=tiny_predictor())
    pipe = LTX2Pipeline.from_options({"audio": True, "audio_loss_weight": 0.5, "frozen_modality": frozen})
    got = pipe.validation_loss(container, held_out_batch(), SampleRNG(seed=3, step=0, sample_ids=[4, 9]), 2)
    assert set(got) == {"loss", "loss_video", "loss_audio"}  # the frozen stream's MSE still reported
    torch.testing.assert_close(got["loss"], got[trained] * (0.5 if trained == "loss_audio" else 1.0))


def test_the_held_out_loss_of_a_sample_is_the_same_in_any_batch(tiny_predictor):
    container = SimpleNamespace(model=tiny_predictor())
    pipe = LTX2Pipeline.from_options({"audio": True})
    batch = held_out_batch()
    whole = pipe.validation_loss(container, batch, SampleRNG(seed=3, step=0, sample_ids=[4, 9]), 3)
    for i, sample_id in enumerate((4, 9)):
        alone = {k: v[i : i + 1] for k, v in batch.items()}
        one = pipe.validation_loss(container, alone, SampleRNG(seed=3, step=0, sample_ids=[sample_id]), 3)
        for name, value in whole.items():
            torch.testing.assert_close(one[name], value[i : i + 1])


def test_unknown_pipeline_option_is_named():
    with pytest.raises(ValueError, match="first_frame_p"):
        LTX2Pipeline.from_options({"first_frame_p": 0.1})


FLOPS_TRANSFORMER = dict(
    in_channels=8, out_channels=8, num_attention_heads=4, attention_head_dim=32, cross_attention_dim=128,
    audio_in_channels=16, audio_out_channels=16, audio_num_attention_heads=4, audio_attention_head_dim=16,
    audio_cross_attention_dim=64, num_layers=2, caption_channels=32,
)  # fmt: skip


@pytest.mark.parametrize("cross_modal", [True, False])
def test_training_flops_match_torch_flop_counter_of_forward_and_backward(cross_modal: bool):
    from ltx2_train.predictor import LTX2Predictor
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    model = LTX2Predictor.build_from_config(SimpleNamespace(config=FLOPS_TRANSFORMER, from_pretrained=None))
    (f, h, w), audio, text = (4, 8, 8), 24, 6
    inputs = dict(
        hidden_states=torch.randn(1, f * h * w, 8), audio_hidden_states=torch.randn(1, audio, 16),
        encoder_hidden_states=torch.randn(1, text, 32), audio_encoder_hidden_states=torch.randn(1, text, 32),
        timestep=torch.tensor([500.0]), audio_timestep=torch.tensor([500.0]), num_frames=f, height=h, width=w,
        fps=8.0, audio_num_frames=audio, isolate_modalities=not cross_modal, return_dict=False,
    )  # fmt: skip
    # SDPA's math backend runs attention as matmuls, which the counter sees (its fused CPU kernel it does not)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        video, audio_out = model(**inputs)
        (video.sum() + audio_out.sum()).backward()
    counted = counter.get_total_flops()
    attention = counter.get_flop_counts()["Global"][torch.ops.aten.bmm]
    assert attention > 0.15 * counted  # the attention term carries weight in this shape
    estimate = model.training_flops(f * h * w, audio, text, cross_modal=cross_modal)
    assert estimate == pytest.approx(counted, rel=0.03)  # patchify, embeddings, modulation, heads left out


def release_batch(release: str, size: int = 2) -> dict:
    """:func:`held_out_batch` with the text embeddings as wide as the tiny transformer of ``release`` takes them
    (2.3 / 2.5: its cross-attention widths, the connectors projecting per modality)."""
    from ltx2_train.release_inputs import text_widths
    from ltx2_train.tiny import RELEASE_OPTIONS, TINY_TRANSFORMER

    video, audio = text_widths(TINY_TRANSFORMER | RELEASE_OPTIONS[release])
    g = torch.Generator().manual_seed(2)
    return {**held_out_batch(size), "prompt_embeds": torch.randn(size, 6, video, generator=g),
            "audio_prompt_embeds": torch.randn(size, 6, audio, generator=g)}  # fmt: skip


@pytest.mark.parametrize("release", ["2.0", "2.3", "2.5"])
def test_a_23_or_25_transformer_gets_each_samples_sigma_and_audio_sigma_and_the_cross_timestep(
    tiny_predictor, release
):
    """As diffusers' LTX-2 pipelines call it: ``sigma`` = the sample's timestep (1000 sigma, not zeroed on
    conditioning tokens), ``audio_sigma`` = the audio timestep, ``use_cross_timestep``; 2.0 gets none."""
    model = tiny_predictor(0, release)
    seen = {}
    model.register_forward_pre_hook(lambda _, args, kwargs: seen.update(kwargs), with_kwargs=True)
    pipe = LTX2Pipeline.from_options(
        {"audio": True, "audio_timesteps": "independent", "first_frame_conditioning_p": 1.0}
    )
    batch, container = release_batch(release), SimpleNamespace(model=model)
    loss = pipe.forward(container, SampleRNG.for_batch(2, seed=3), **batch).loss
    noised = pipe.noising(pipe.prepare_conditions(container, batch), SampleRNG.for_batch(2, seed=3))
    assert torch.isfinite(loss) and noised["conditioned"].any()
    torch.testing.assert_close(seen["timestep"], 1000 * noised["video_timestep"])  # per token
    if release == "2.0":
        assert {"sigma", "audio_sigma", "use_cross_timestep"}.isdisjoint(seen)
        return
    torch.testing.assert_close(seen["sigma"], 1000 * noised["sigma"])
    torch.testing.assert_close(seen["audio_sigma"], 1000 * noised["audio_sigma"])
    assert seen["use_cross_timestep"] is True


@pytest.mark.parametrize(("release", "audio_width"), [("2.3", 32), ("2.0", 16)])
def test_text_embeddings_of_another_releases_width_are_refused_naming_both_widths(
    tiny_predictor, release, audio_width
):
    batch = release_batch(release)
    batch["audio_prompt_embeds"] = batch["audio_prompt_embeds"][..., :1].expand(-1, -1, audio_width)
    want = "32 and 32" if release == "2.0" else "32 and 16"
    with pytest.raises(ValueError, match=rf"\(video, audio\) 32 and {audio_width} wide; the LTX-{release} "
                                         rf"transformer takes {want}: preprocess"):  # fmt: skip
        LTX2Pipeline(audio=True).prepare_conditions(SimpleNamespace(model=tiny_predictor(0, release)), batch)
