"""Classifier-free guidance of ``ltx2_train.sampling.sample_clip`` per stream, as diffusers' ``LTX2Pipeline``
takes it: ``guidance_scale`` guides the video, ``audio_guidance_scale`` (None: the video's) the audio.

One Euler step from the noise: each stream's result is then its own guided velocity at the noise, so a
scale that guides one stream must leave the other's clip as it was (over more steps the streams meet in
the audio-video cross-attention)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.slow

PROMPT = "A red circle slides up across a dark grey background."


@pytest.fixture(scope="module")
def draw(tiny_cache):
    """``draw(guidance_scale, audio_guidance_scale) -> (video, log-mel)``: one step of the tiny set's encoders
    and a randomly initialised tiny transformer (patch size 1, 32 wide), seed 3, against the empty prompt
    (both prompts encoded once)."""
    from ltx2_train.pipeline import LTX2Pipeline
    from ltx2_train.preprocess import LTX2Encoders
    from ltx2_train.sampling import sample_clip
    from ltx2_train.tiny import tiny_transformer

    torch.manual_seed(0)
    encoders = LTX2Encoders.load(tiny_cache, audio=True, device=torch.device("cpu"), dtype=torch.float32)
    modules = {"holder": SimpleNamespace(model=tiny_transformer().eval()), "pipeline": LTX2Pipeline(),
               "encoders": encoders, "text_len": 16}  # fmt: skip
    texts = {text: encoders.encode_text(text, 16) for text in (PROMPT, "")}
    return lambda scale, audio_scale: sample_clip(
        modules, PROMPT, num_frames=5, height=16, width=16, frame_rate=8.0, steps=1, seed=3,
        guidance_scale=scale, audio_guidance_scale=audio_scale, texts=texts,
    )  # fmt: skip


def test_each_scale_guides_its_own_stream_alone_and_the_audio_follows_the_video_scale_by_default(draw):
    video, audio = draw(1.0, None)
    audio_guided, video_guided, both = draw(1.0, 4.0), draw(4.0, 1.0), draw(4.0, None)
    assert torch.equal(audio_guided[0], video) and (audio_guided[1] - audio).abs().mean() > 1e-3
    assert torch.equal(video_guided[1], audio) and (video_guided[0] - video).abs().mean() > 1e-3
    assert torch.equal(both[0], video_guided[0]) and torch.equal(
        both[1], audio_guided[1]
    )  # None: the video's 4


def test_an_audio_scale_is_refused_for_a_run_without_audio():
    from ltx2_train.pipeline import LTX2Pipeline
    from ltx2_train.sampling import sample_clip

    modules = {"pipeline": LTX2Pipeline(audio=False), "encoders": None, "holder": None}
    with pytest.raises(ValueError, match=r"audio_guidance_scale: this run samples no audio"):
        sample_clip(
            modules, PROMPT, num_frames=5, height=16, width=16, frame_rate=8.0, audio_guidance_scale=2.0
        )
