"""``training.validation`` asks the model for hooks (a model without them is refused before training)
and logs its clips (and their audio) to TensorBoard."""

from __future__ import annotations

import wave

import pytest
import torch
from mm_config import ValidationConfig
from mm_trainer import MetricsLogger, ModelContainer, SampledClip, Validator
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn


def _validator(model: nn.Module, **section) -> Validator:
    return Validator(
        model, ValidationConfig(**section), data=None, seed=0, out_dir="unused", device=torch.device("cpu")
    )


def test_prompts_are_refused_for_a_model_that_cannot_sample():
    model = ModelContainer({"predictor": nn.Linear(2, 2)}, trainable=("predictor",))
    with pytest.raises(ValueError, match=r"training.validation.prompts: ModelContainer has no sample\("):
        _validator(model, prompts=["a red square"])


def test_held_out_data_is_refused_for_a_model_whose_pipeline_has_no_validation_loss():
    model = ModelContainer({"predictor": nn.Linear(2, 2)}, trainable=("predictor",))
    with pytest.raises(
        ValueError, match=r"training.validation.data_path: ModelContainer computes no held-out"
    ):
        _validator(model, data_path="held_out.json")


def test_a_validation_clip_goes_to_tensorboard_as_its_frames(tmp_path):
    metrics = MetricsLogger(total_steps=10, log_dir=tmp_path, tensorboard=True)
    metrics.add_video("validation/0", torch.rand(3, 5, 8, 6) * 2 - 1, step=10)
    metrics.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"images": 0}).Reload()
    images = events.Images("validation/0")
    assert [(i.step, i.height, i.width) for i in images] == [(10, 8, 6 * 5)]  # the 5 frames side by side


class Sounding(ModelContainer):
    """A container whose ``sample`` hook returns a clip with audio, and that records ``prepare_sampling``."""

    def __init__(self) -> None:
        super().__init__({"predictor": nn.Linear(2, 2)}, trainable=("predictor",))
        self.prepared: list[tuple] = []

    def prepare_sampling(self, validation, *, data, device) -> None:
        self.prepared.append((validation.prompts, validation.negative_prompt, data, device))

    def sample(
        self, prompt, *, seed, num_frames, height, width, steps, guidance_scale, negative_prompt, shift, fps
    ):
        g = torch.Generator().manual_seed(seed)
        video = torch.rand(3, num_frames, height, width, generator=g) * 2 - 1
        return SampledClip(video, torch.rand(2, 4 * fps, generator=g) - 0.5, sample_rate=4 * fps)


def test_a_clip_with_audio_is_written_with_its_wav_and_logged_to_tensorboard(tmp_path):
    model = Sounding()
    section = dict(
        prompts=["a drum", "a bell"], negative_prompt="noise", num_frames=3, height=8, width=8, fps=4
    )
    validator = Validator(model, ValidationConfig(**section), data="the data section", seed=0, out_dir=tmp_path,
                          device=torch.device("cpu"))  # fmt: skip
    assert model.prepared == [(["a drum", "a bell"], "noise", "the data section", torch.device("cpu"))]
    metrics = MetricsLogger(total_steps=500, log_dir=tmp_path, tensorboard=True)
    validator.run(500, metrics)
    metrics.close()
    written = tmp_path / "validation" / "iter_0000500"
    assert sorted(p.name for p in written.iterdir()) == ["0.mp4", "0.wav", "1.mp4", "1.wav"]
    with wave.open(str(written / "1.wav")) as wav:
        assert (wav.getnchannels(), wav.getframerate(), wav.getnframes()) == (2, 16, 16)
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"audio": 0}).Reload()
    assert [a.step for a in events.Audio("validation/1_audio")] == [500]


class Guided(Sounding):
    """A sounding container whose ``sample`` takes ``audio_guidance_scale`` and records what it got."""

    def __init__(self) -> None:
        super().__init__()
        self.scales: list[tuple] = []

    def sample(self, prompt, *, guidance_scale, audio_guidance_scale=None, **kwargs):
        self.scales.append((guidance_scale, audio_guidance_scale))
        return super().sample(prompt, guidance_scale=guidance_scale, **kwargs)


def test_an_audio_guidance_scale_reaches_a_sample_hook_that_takes_it_and_is_refused_by_one_that_does_not(
    tmp_path,
):
    section = dict(prompts=["a drum"], num_frames=3, height=8, width=8, fps=4, guidance_scale=1.5)
    with pytest.raises(
        ValueError, match=r"training.validation.audio_guidance_scale: Sounding samples no audio"
    ):
        _validator(Sounding(), **section, audio_guidance_scale=4.0)
    model = Guided()
    for audio_scale in (4.0, None):
        Validator(model, ValidationConfig(**section, audio_guidance_scale=audio_scale), data=None, seed=0,
                  out_dir=tmp_path, device=torch.device("cpu")).run(500)  # fmt: skip
    assert model.scales == [(1.5, 4.0), (1.5, None)]  # None: the hook's own default (the video's scale)
