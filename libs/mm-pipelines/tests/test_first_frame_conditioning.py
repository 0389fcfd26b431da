"""I2V (channel concat of mask + image latents) and TI2V (clean first frame, excluded from loss)."""

from __future__ import annotations

import pytest
import torch
from mm_pipelines import FlowMatchScheduler, FlowMatchT2VPipeline, SampleRNG, first_frame_video


def keys(seed: int = 0, batch_size: int = 2) -> SampleRNG:
    return SampleRNG.for_batch(batch_size, seed=seed)


def test_i2v_predictor_input_has_36_channels_for_wan_sized_latents(toys, batch) -> None:
    container = toys.Container(latent_channels=16, predictor_in=36)
    pipe = FlowMatchT2VPipeline(FlowMatchScheduler(), task="i2v")
    noised = pipe.noising(pipe.prepare_conditions(container, batch), keys())
    assert noised["hidden_states"].shape == (2, 36, 3, 4, 4)
    assert noised["target"].shape == (2, 16, 3, 4, 4)
    assert torch.isfinite(pipe.compute_loss(pipe.predict(container, noised), noised))


def test_i2v_mask_marks_only_the_first_latent_frame(toys, batch) -> None:
    pipe = FlowMatchT2VPipeline(FlowMatchScheduler(), task="i2v")
    container = toys.Container(predictor_in=12)
    mask = pipe.noising(pipe.prepare_conditions(container, batch), keys())["hidden_states"][:, 4:8]
    assert torch.all(mask[:, :, 0] == 1) and torch.all(mask[:, :, 1:] == 0)


def test_i2v_image_latents_encode_the_first_frame_with_later_frames_zeroed(toys, batch) -> None:
    pipe = FlowMatchT2VPipeline(FlowMatchScheduler(), task="i2v")
    container = toys.Container(predictor_in=12)
    image = pipe.noising(pipe.prepare_conditions(container, batch), keys())["hidden_states"][:, 8:]
    video = batch["video"].clone()
    video[:, :, 1:] = 0
    torch.testing.assert_close(image, container.ae.encode(video))


def test_i2v_uses_precomputed_image_latents(toys) -> None:
    pipe = FlowMatchT2VPipeline(FlowMatchScheduler(), task="i2v")
    image_latents = torch.randn(2, 4, 3, 4, 4)
    batch = {
        "latents": torch.randn(2, 4, 3, 4, 4),
        "image_latents": image_latents,
        "prompt_embeds": torch.randn(2, 5, 8),
    }
    noised = pipe.noising(pipe.prepare_conditions(toys.Container(predictor_in=12), batch), keys())
    assert torch.equal(noised["hidden_states"][:, 8:], image_latents)


def test_i2v_rejects_image_latents_of_another_size(toys) -> None:
    pipe = FlowMatchT2VPipeline(FlowMatchScheduler(), task="i2v")
    batch = {
        "latents": torch.randn(2, 4, 3, 4, 4),
        "image_latents": torch.randn(2, 4, 2, 4, 4),
        "prompt_embeds": torch.randn(2, 5, 8),
    }
    with pytest.raises(ValueError, match="image_latents shape"):
        pipe.prepare_conditions(toys.Container(), batch)


def test_ti2v_first_noised_frame_is_the_clean_latent(toys, batch) -> None:
    pipe = FlowMatchT2VPipeline(FlowMatchScheduler(), task="ti2v")
    conditions = pipe.prepare_conditions(toys.Container(), batch)
    noised = pipe.noising(conditions, keys())
    x0, x_t = conditions["latents"], noised["hidden_states"]
    assert x_t.shape == x0.shape
    assert torch.equal(x_t[:, :, 0], x0[:, :, 0])
    assert not torch.allclose(x_t[:, :, 1:], x0[:, :, 1:])


def test_ti2v_loss_ignores_the_first_frame(toys, batch) -> None:
    pipe = FlowMatchT2VPipeline(FlowMatchScheduler(weighting=False), task="ti2v")
    container = toys.Container()
    noised = pipe.noising(pipe.prepare_conditions(container, batch), keys())
    pred = pipe.predict(container, noised).detach()
    base = pipe.compute_loss(pred, noised)
    torch.testing.assert_close(base, (pred[:, :, 1:] - noised["target"][:, :, 1:]).pow(2).mean())
    changed_first, changed_second = pred.clone(), pred.clone()
    changed_first[:, :, 0] += 10.0
    changed_second[:, :, 1] += 10.0
    assert torch.equal(pipe.compute_loss(changed_first, noised), base)
    assert pipe.compute_loss(changed_second, noised) > base


def test_first_frame_video_keeps_frame_zero_only(batch) -> None:
    out = first_frame_video(batch["video"])
    assert torch.equal(out[:, :, 0], batch["video"][:, :, 0]) and torch.all(out[:, :, 1:] == 0)
