"""LTX-2 clean-context modes of the one pipeline: IC-LoRA reference tokens, A2V / V2A and audio extension.

Each is checked at the transformer's door (its forward's keywords) and in the loss: the clean tokens are not
noised, get timestep 0 and no loss; the reference tokens sit after the target's at the RoPE positions of
diffusers' IC-LoRA pipeline."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from ltx2_train.config_schema import LTX2ContainerPipelineOptions, LTX2PipelineOptions
from ltx2_train.pipeline import LTX2Pipeline, pack_audio, pack_video
from ltx2_train.release_inputs import text_widths
from ltx2_train.timesteps import SigmaSampler
from ltx2_train.tiny import RELEASE_OPTIONS, TINY_TRANSFORMER
from mm_pipelines import SampleRNG

REF_GRID = (1, 4, 4)  # a one-latent-frame reference: other positions than the target's 2 frames
REF_AUDIO = 3


def batch(reference: bool = True, release: str = "2.0") -> dict:
    """Two samples of 2 x 4 x 4 latents and 6 audio frames, text as wide as ``release``'s tiny transformer
    takes it; with ``reference``, a reference clip of :data:`REF_GRID` and :data:`REF_AUDIO` audio frames."""
    video_width, audio_width = text_widths(TINY_TRANSFORMER | RELEASE_OPTIONS[release])
    g = torch.Generator().manual_seed(0)
    out = {
        "latents": torch.randn(2, 8, 2, 4, 4, generator=g),
        "audio_latents": torch.randn(2, 4, 6, 4, generator=g),
        "prompt_embeds": torch.randn(2, 6, video_width, generator=g),
        "audio_prompt_embeds": torch.randn(2, 6, audio_width, generator=g),
        "prompt_attention_mask": torch.ones(2, 6, dtype=torch.long),
        "frame_rate": torch.tensor([8.0, 8.0]),
    }
    if reference:
        out["reference_latents"] = torch.randn(2, 8, *REF_GRID, generator=g)
        out["reference_audio_latents"] = torch.randn(2, 4, REF_AUDIO, 4, generator=g)
    return out


def run(pipe: LTX2Pipeline, model, data: dict, seed: int = 3):
    """The pipeline's forward on ``data``; the transformer's keywords, the noised state and the output."""
    seen = {}
    handle = model.register_forward_pre_hook(lambda _, args, kwargs: seen.update(kwargs), with_kwargs=True)
    container = SimpleNamespace(model=model)
    out = pipe.forward(container, SampleRNG.for_batch(2, seed=seed), **data)
    handle.remove()
    noised = pipe.noising(pipe.prepare_conditions(container, data), SampleRNG.for_batch(2, seed=seed))
    return seen, noised, out


def test_reference_tokens_follow_the_target_clean_at_timestep_zero_at_the_ic_lora_pipelines_positions(
    tiny_predictor,
):
    model = tiny_predictor()
    pipe = LTX2Pipeline.from_options({"reference": "audio_video"})
    data = batch()
    seen, noised, out = run(pipe, model, data)
    ref_video, ref_audio = pack_video(data["reference_latents"]), pack_audio(data["reference_audio_latents"])
    # [target | reference], the reference as cached (not noised)
    assert seen["hidden_states"].shape[1] == 32 + 16 and seen["audio_hidden_states"].shape[1] == 6 + REF_AUDIO
    torch.testing.assert_close(seen["hidden_states"][:, :32], noised["noisy_video"], rtol=0, atol=0)
    torch.testing.assert_close(seen["hidden_states"][:, 32:], ref_video, rtol=0, atol=0)
    torch.testing.assert_close(seen["audio_hidden_states"][:, 6:], ref_audio, rtol=0, atol=0)
    # timestep 0 on the reference tokens, the sample's elsewhere
    torch.testing.assert_close(seen["timestep"][:, :32], 1000 * noised["sigma"][:, None].expand(-1, 32))
    assert (seen["timestep"][:, 32:] == 0).all() and (seen["timestep"][:, :32] > 0).all()
    assert (seen["audio_timestep"][:, 6:] == 0).all() and (seen["audio_timestep"][:, :6] > 0).all()
    # positions: diffusers' IC-LoRA pipeline's (rope.prepare_video_coords of the reference's own grid, from 0)
    target = model.rope.prepare_video_coords(2, 2, 4, 4, "cpu", fps=8.0)
    reference = model.rope.prepare_video_coords(2, *REF_GRID, "cpu", fps=8.0)
    torch.testing.assert_close(seen["video_coords"], torch.cat([target, reference], dim=2), rtol=0, atol=0)
    torch.testing.assert_close(
        seen["video_coords"][:, :, 32:], seen["video_coords"][:, :, :16], rtol=0, atol=0
    )
    audio = model.audio_rope.prepare_audio_coords(2, 6, "cpu")
    want_audio = torch.cat([audio, model.audio_rope.prepare_audio_coords(2, REF_AUDIO, "cpu")], dim=2)
    torch.testing.assert_close(seen["audio_coords"], want_audio, rtol=0, atol=0)
    assert out.metrics["num_tokens"] == 2 * (32 + 16 + 6 + REF_AUDIO)


def test_the_loss_is_the_targets_alone_and_the_references_outputs_are_dropped(tiny_predictor):
    model = tiny_predictor()
    pipe = LTX2Pipeline.from_options({"reference": "audio_video", "audio_loss_weight": 0.5})
    data = batch()
    container = SimpleNamespace(model=model)
    noised = pipe.noising(pipe.prepare_conditions(container, data), SampleRNG.for_batch(2, seed=3))
    video, audio = pipe.predict(container, noised)
    assert video.shape == noised["video_target"].shape and audio.shape == noised["audio_target"].shape
    want = (video - noised["video_target"]).pow(2).mean() + 0.5 * (audio - noised["audio_target"]).pow(
        2
    ).mean()
    torch.testing.assert_close(pipe.compute_loss((video, audio), noised), want)
    # the reference is context: another reference changes the target's prediction
    other = {**noised, "reference_video": noised["reference_video"] + 1.0}
    assert not torch.allclose(pipe.predict(container, other)[0], video)


def test_a2v_gives_the_audio_clean_at_timestep_zero_and_trains_the_video_alone(tiny_predictor):
    pipe = LTX2Pipeline.from_options({"condition_modality": "audio", "audio_loss_weight": 0.5})
    data = batch(reference=False)
    seen, noised, out = run(pipe, tiny_predictor(), data)
    torch.testing.assert_close(noised["noisy_audio"], pack_audio(data["audio_latents"]), rtol=0, atol=0)
    assert (seen["audio_timestep"] == 0).all() and (seen["timestep"] > 0).all()
    loss = pipe.compute_loss((noised["video_target"] + 2.0, noised["audio_target"] + 1.0), noised)
    assert loss.item() == pytest.approx(4.0, rel=1e-6)
    assert "loss_audio" not in out.metrics and out.metrics["loss_video"] == pytest.approx(out.loss.item())


@pytest.mark.parametrize("release", ["2.0", "2.3"])
def test_v2a_gives_the_video_clean_at_timestep_zero_and_trains_the_audio_alone(tiny_predictor, release):
    pipe = LTX2Pipeline.from_options({"condition_modality": "video", "audio_loss_weight": 0.5})
    data = batch(reference=False, release=release)
    seen, noised, out = run(pipe, tiny_predictor(0, release), data)
    torch.testing.assert_close(noised["noisy_video"], pack_video(data["latents"]), rtol=0, atol=0)
    assert (seen["timestep"] == 0).all() and (seen["audio_timestep"] > 0).all()
    if release == "2.3":  # the prompt modulation sees each stream's own noise level
        assert (seen["sigma"] == 0).all() and (seen["audio_sigma"] > 0).all()
    loss = pipe.compute_loss((noised["video_target"] + 2.0, noised["audio_target"] + 1.0), noised)
    assert loss.item() == pytest.approx(0.5, rel=1e-6)
    assert "loss_video" not in out.metrics and out.metrics["loss_audio"] == pytest.approx(
        out.loss.item() / 0.5
    )


def test_audio_extension_keeps_the_first_k_audio_frames_clean_at_timestep_zero_without_loss(tiny_predictor):
    pipe = LTX2Pipeline.from_options({"audio_conditioning_frames": 2})
    data = batch(reference=False)
    seen, noised, _ = run(pipe, tiny_predictor(), data)
    a0 = pack_audio(data["audio_latents"])
    torch.testing.assert_close(noised["noisy_audio"][:, :2], a0[:, :2], rtol=0, atol=0)
    assert not torch.allclose(noised["noisy_audio"][:, 2:], a0[:, 2:])
    assert (seen["audio_timestep"][:, :2] == 0).all()
    torch.testing.assert_close(
        seen["audio_timestep"][:, 2:], 1000 * noised["audio_sigma"][:, None].expand(-1, 4)
    )
    audio = noised["audio_target"].clone()
    audio[:, :2] += 100.0
    audio[:, 2:] += 1.0
    assert pipe.compute_loss((noised["video_target"] + 2.0, audio), noised).item() == pytest.approx(
        5.0, rel=1e-6
    )


def test_held_out_loss_keeps_the_condition_clean_and_out_of_the_loss(tiny_predictor):
    """A2V's held-out loss is the video's alone: the same whatever the audio's prediction error."""
    container = SimpleNamespace(model=tiny_predictor())
    rng = SampleRNG(seed=3, step=0, sample_ids=[4, 9])
    a2v = LTX2Pipeline.from_options({"condition_modality": "audio"})
    got = a2v.validation_loss(container, batch(reference=False), rng, 2)
    cond = a2v.prepare_conditions(container, batch(reference=False))
    eps = rng.randn("noise", cond["video"].shape[1:])
    want = torch.zeros(2)
    with torch.no_grad():
        for sigma in (0.25, 0.75):
            s = torch.full((2,), sigma)
            noised = {**cond, "sigma": s, "video_timestep": s, "audio_sigma": torch.zeros(2),
                      "noisy_video": (1 - sigma) * cond["video"] + sigma * eps, "noisy_audio": cond["audio"]}  # fmt: skip
            video, _ = a2v.predict(container, noised)
            want += (video - (eps - cond["video"])).pow(2).mean(dim=(1, 2)) / 2
    assert set(got) == {"loss", "loss_video"}  # no audio loss: the condition stream is not trained
    torch.testing.assert_close(got["loss"], want)
    torch.testing.assert_close(got["loss_video"], want)


@pytest.mark.parametrize(
    ("options", "key", "match"),
    [
        ({"audio": False, "condition_modality": "audio"}, "condition_modality", "needs the audio stream"),
        ({"audio": False, "reference": "audio"}, "reference", "expected none or video"),
        (
            {"condition_modality": "audio", "frozen_modality": "video"},
            "condition_modality",
            "nothing to train",
        ),
        (
            {"condition_modality": "video", "audio_timesteps": "independent"},
            "audio_timesteps",
            "expected shared",
        ),
        (
            {"condition_modality": "video", "first_frame_conditioning_p": 0.5},
            "first_frame_conditioning_p",
            "0",
        ),
        ({"condition_modality": "audio", "audio_conditioning_frames": 2}, "audio_conditioning_frames", "0"),
    ],
)
def test_conditioning_keys_that_cannot_act_together_are_refused_by_the_check_and_the_pipeline(
    options, key, match
):
    with pytest.raises(ValueError, match=rf"{key} = .*{match}"):
        LTX2PipelineOptions(**options)
    with pytest.raises(ValueError, match=rf"model.pipeline.{key}: .*{match}"):
        LTX2Pipeline.from_options(options)


def test_a_distillation_refuses_the_clean_context_modes():
    with pytest.raises(ValueError, match="reference = .video.: a distillation draws no reference clip"):
        LTX2ContainerPipelineOptions(reference="video", distill={"shift": 3.0, "student_steps": 4})


def test_a_reference_run_on_a_cache_without_references_and_audio_too_short_to_extend_are_refused(
    tiny_predictor,
):
    container = SimpleNamespace(model=tiny_predictor())
    with pytest.raises(
        KeyError, match=r"reference=video but the batch has no \['reference_latents'\]: preprocess"
    ):
        LTX2Pipeline(SigmaSampler(), reference="video").prepare_conditions(container, batch(reference=False))
    with pytest.raises(
        ValueError, match=r"6 audio latent frame\(s\) leave none .*audio_conditioning_frames=6"
    ):
        LTX2Pipeline(audio_conditioning_frames=6).prepare_conditions(container, batch(reference=False))
