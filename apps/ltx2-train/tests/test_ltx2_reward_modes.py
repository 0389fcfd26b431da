"""LTX-2 reward fine-tuning (``model.pipeline.grpo`` / ``nft`` of ``ltx2_container``) on the tiny transformer:
rollouts of the video and audio streams keyed by prompt, group index and stream, each transition's
log-probability the Gaussian density over both streams' elements, DiffusionNFT's loss weighting each stream
as the training loss does, and the config keys the modes refuse."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from ltx2_train.container import LTX2Container
from ltx2_train.tiny import TINY_TRANSFORMER
from mm_pipelines import SampleRNG

VIDEO_FHW, AUDIO_LEN, TEXT_LEN = (3, 4, 4), 7, 6  # as tests/conftest.py's inputs
GRPO = {"shift": 3.0, "group_size": 2, "sampling_steps": 2, "noise_level": 0.7, "kl_weight": 0.0}
GRPO_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tiny_t2av_grpo.yaml"
NFT = {"shift": 3.0, "group_size": 2, "sampling_steps": 2, "timestep_fraction": 0.5, "kl_weight": 0.0}


def container(tiny_predictor, key: str, options: dict, **pipeline: object) -> LTX2Container:
    """The policy ``model`` (trainable) with the reward fine-tuning ``key`` around the pipeline; its scorer
    rewards each clip by its video latents' mean (a stand-in for ``training.rewards``)."""
    model = copy.deepcopy(tiny_predictor(0)).requires_grad_(True)
    built = LTX2Container.build_pipeline({"audio": True, **pipeline, key: options})
    box = LTX2Container({"model": model}, trainable=("model",), pipeline=built)
    box.pipeline.scorer = lambda latents, prompts, groups, names: (latents.double().flatten(1).mean(1), {})
    return box


def batch(size: int) -> dict[str, torch.Tensor]:
    """Cached-latent inputs of the tiny transformer: video ``[B, 8, 3, 4, 4]``, audio ``[B, 4, 7, 4]``."""
    g = torch.Generator().manual_seed(3)
    return {
        "latents": torch.randn(size, 8, *VIDEO_FHW, generator=g),
        "audio_latents": torch.randn(size, 4, AUDIO_LEN, 4, generator=g),
        "prompt_embeds": torch.randn(size, TEXT_LEN, TINY_TRANSFORMER["caption_channels"], generator=g),
        "prompt_attention_mask": torch.ones(size, TEXT_LEN, dtype=torch.long),
        "frame_rate": torch.full((size,), 8.0),
    }


def rollout(box: LTX2Container, prompts: dict, rows: slice, ids: list[int]):
    """Flow-GRPO's rollout of the clips ``rows`` (prompts' clips, ``G`` per prompt) of ``prompts``'s
    conditions, keyed by the global sample ``ids``."""
    grpo, base = box.pipeline, box.pipeline.base
    conditions = base.prepare_conditions(box, prompts)
    clips = grpo.clip_conditions(box, prompts, conditions)
    part = {k: v[rows] if isinstance(v, torch.Tensor) else v for k, v in clips.items()}
    shapes = {n: tuple(x.shape[1:]) for n, x in base.clean_state(conditions).items()}
    return grpo.rollout(box, part, SampleRNG(seed=1, step=3, sample_ids=ids), shapes), part


def test_rollouts_of_both_streams_are_the_same_whatever_micro_batches_the_prompts_are_split_into(
    tiny_predictor,
):
    """Prompts 5 and 9 in one micro-batch, or one each: the same video and audio states and log-probabilities;
    the audio starts from its own keyed draw (purpose ``grpo_start_audio_<g>``), the video from Wan's key."""
    box = container(tiny_predictor, "grpo", GRPO)
    prompts = batch(2)
    both, _ = rollout(box, prompts, slice(0, 4), [5, 9])
    halves = [rollout(box, prompts, slice(0, 2), [5])[0], rollout(box, prompts, slice(2, 4), [9])[0]]
    assert set(both.states) == {"video", "audio"}
    for name in ("video", "audio"):
        joined = torch.cat([h.states[name] for h in halves], dim=1)
        torch.testing.assert_close(both.states[name], joined, rtol=0, atol=1e-5)
    torch.testing.assert_close(
        both.log_probs, torch.cat([h.log_probs for h in halves], dim=1), rtol=0, atol=1e-5
    )
    rng = SampleRNG(seed=1, step=3, sample_ids=[9])
    top = float(both.sigmas[0])
    for name, purpose in (("video", "grpo_start_1"), ("audio", "grpo_start_audio_1")):
        start = rng.randn(purpose, tuple(both.states[name].shape[2:]))[0] * top
        torch.testing.assert_close(both.states[name][0, 3], start, rtol=0, atol=1e-6)  # prompt 9, group 1
    assert not torch.allclose(both.samples["audio"][0], both.samples["audio"][1])


def test_a_transitions_log_prob_is_the_gaussian_density_over_every_element_of_both_streams(tiny_predictor):
    """``log p(x' | x)`` of the rollout: the mean over the video's and the audio's elements of the Gaussian
    log-density at the SDE step's mean and std, computed here in float64 from the policy's velocity."""
    box = container(tiny_predictor, "grpo", GRPO)
    done, clips = rollout(box, batch(1), slice(0, 2), [0])
    sigmas, a, k = done.sigmas, GRPO["noise_level"], 1
    s, dt = float(sigmas[k]), float(sigmas[k + 1] - sigmas[k])
    g = a * math.sqrt(s / (1 - s))
    std = g * math.sqrt(-dt)
    x = done.state(k)
    with torch.no_grad():
        v = box.pipeline.base.state_velocity(box, "predictor", x, torch.full((2,), s), clips)
    densities = []
    for name in ("video", "audio"):
        xs, vs = x[name].double(), v[name].double()
        mean = xs + (vs + g * g / (2 * s) * (xs + (1 - s) * vs)) * dt
        z = (done.states[name][k + 1].double() - mean) / std
        densities.append((-0.5 * z**2 - math.log(std) - 0.5 * math.log(2 * math.pi)).flatten(1))
    expected = torch.cat(densities, dim=1).mean(dim=1)
    torch.testing.assert_close(done.log_probs[k].double(), expected, rtol=1e-5, atol=1e-5)


def test_nft_weights_each_streams_loss_as_the_training_loss_does(tiny_predictor):
    """DiffusionNFT's loss is ``L_video + audio_loss_weight x L_audio``: linear in the weight, the video's
    alone at weight 0 (the same keyed rollouts and noise each time, the policy unchanged)."""
    box = container(tiny_predictor, "nft", NFT)
    losses = {}
    for weight in (0.0, 1.0, 2.0):
        box.pipeline.base.audio_loss_weight = weight
        with torch.no_grad():
            losses[weight] = float(
                box(**batch(1), rng=SampleRNG(seed=1, step=0, sample_ids=[0]), phase="nft").loss
            )
    audio = losses[1.0] - losses[0.0]
    assert abs(audio) > 1e-6 and losses[0.0] > 0
    assert losses[2.0] == pytest.approx(losses[0.0] + 2 * audio, rel=1e-5)


def test_a_scorer_of_audio_gets_each_clips_audio_latents_unpacked_from_the_rollouts_tokens(tiny_predictor):
    """A scorer that ``needs_audio`` (a reward on audio) gets ``audio=`` the clips' audio latents
    ``[N, C, L, M]``, the cache's layout: packed again they are the rollout's audio tokens."""
    from ltx2_train.pipeline import pack_audio

    box = container(tiny_predictor, "grpo", GRPO)
    seen = {}

    class AudioScorer:
        needs_audio = True

        def __call__(self, latents, prompts, *, groups, names, audio):
            seen.update(latents=latents, audio=audio)
            return audio.double().flatten(1).mean(1), {}

    box.pipeline.scorer = AudioScorer()
    prompts = batch(1)
    box(**prompts, rng=SampleRNG(seed=1, step=3, sample_ids=[0]), phase="grpo")
    clips, _ = rollout(box, prompts, slice(0, 2), [0])
    assert seen["audio"].shape == (2, *prompts["audio_latents"].shape[1:])
    torch.testing.assert_close(pack_audio(seen["audio"]), clips.samples["audio"])
    assert seen["latents"].shape == (2, *prompts["latents"].shape[1:])


def test_a_reward_on_audio_without_the_audio_stream_is_refused_before_training(tiny_predictor):
    box = container(tiny_predictor, "grpo", GRPO, audio=False)
    with pytest.raises(ValueError, match="score audio, and model.pipeline.audio is false"):
        box.prepare_decoding(data=None, device=torch.device("cpu"), frames=True, audio=True)


def test_the_audio_decoders_griffin_lim_keeps_a_tones_pitch_for_tone_target():
    """``decoding.audio_waveforms`` (what ``decode_audio`` ends with) of the log-mel of a 220 Hz tone: its
    dominant frequency within a quarter octave of 220 Hz (16 mel bins, as the tiny model set's)."""
    from types import SimpleNamespace

    from ltx2_train.audio import log_mel, synthetic_tone
    from ltx2_train.decoding import audio_waveforms
    from ltx2_train.preprocess import LTX2Encoders
    from mm_trainer import ToneTarget

    config = SimpleNamespace(sample_rate=16000, mel_hop_length=160, mel_bins=16)
    mel = log_mel(synthetic_tone(0, 16000, 10000), sample_rate=16000, hop_length=160, n_fft=LTX2Encoders.n_fft,
                  mel_bins=16)  # fmt: skip
    waves, rate = audio_waveforms(SimpleNamespace(config=config), mel[None])
    assert rate == 16000 and waves.shape[:2] == (1, 2)
    assert float(ToneTarget(220.0)(waves, [""], sample_rate=rate)) > -0.25


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.pipeline.grpo.shift=null", r"grpo.shift"),
        ("model.pipeline.frozen_modality=audio", r"frozen_modality.*trains both streams"),
        ("model.pipeline.condition_modality=audio", r"condition_modality.*both streams from noise"),
        ("model.pipeline.grpo.guidance_scale=3", r"grpo.guidance_scale.*no negative ones"),
        ("model.pipeline.timestep_sampling=uniform", r"timestep_sampling.*grid of grpo.shift"),
        ("model.pipeline.nft={shift: 3.0}", r"model.pipeline.nft.*one training mode at a time"),
    ],
)
def test_a_key_ltx2_grpo_cannot_use_is_refused_by_the_config_check(override, message):
    from mm_config import ConfigError, load_config

    with pytest.raises(ConfigError, match=message):
        load_config(GRPO_CONFIG, [override], world_size=2)


def test_a_full_policy_with_a_kl_term_and_no_reference_is_refused_before_it_is_built():
    from mm_config import ConfigError, check_config, load_config

    assert LTX2Container.sub_model_problems(load_config(GRPO_CONFIG, world_size=2).model) == {}
    full = ["model.models.model.lora=null"]
    with pytest.raises(ConfigError, match=r"model.models.model: .*needs a reference"):
        check_config(GRPO_CONFIG, full, world_size=2, check_paths=False)
    no_kl = load_config(GRPO_CONFIG, [*full, "model.pipeline.grpo.kl_weight=0"], world_size=2)
    assert LTX2Container.sub_model_problems(no_kl.model) == {}
