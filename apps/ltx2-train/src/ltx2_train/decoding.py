"""Decoding LTX-2 latents: video latents to frames and audio latents to waveforms, for ``ltx2-train sample``'s
clips and a reward fine-tuning's rollouts (``LTX2Container.decode_latents`` / ``decode_audio``, for the
rewards that score frames or audio).

The cache holds latents normalised with each VAE's statistics: the video's ``(z - mean) * scaling_factor /
std``, the audio's packed tokens ``(z - mean) / std``; decoding undoes that and runs the VAE's decoder: the
video to ``[N, 3, F, H, W]`` in ``[-1, 1]``, the audio to a log-mel spectrogram ``[2, T, mel_bins]`` per clip,
which Griffin-Lim turns into a stereo waveform (:func:`ltx2_train.audio.mel_to_waveform`: the tiny model set
has no vocoder, and this one serves every set alike).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video

from ltx2_train.audio import mel_to_waveform
from ltx2_train.pipeline import pack_audio, unpack_audio
from ltx2_train.preprocess import LTX2Encoders
from ltx2_train.release_file import load_release_encoders


@torch.no_grad()
def decode_video(vae: AutoencoderKLLTX2Video, latents: torch.Tensor) -> torch.Tensor:
    """Frames ``[N, 3, F, H, W]`` (fp32, in ``[-1, 1]``) of normalised video latents ``[N, C, F', H', W']``,
    one clip at a time (a batch of rollouts need not fit the decoder's activations at once)."""
    mean, std = (x.view(1, -1, 1, 1, 1) for x in (vae.latents_mean, vae.latents_std))
    raw = latents.to(mean.device) * std / vae.config.scaling_factor + mean
    clips = [vae.decode(clip[None].to(vae.dtype)).sample for clip in raw]
    return torch.cat(clips).float().clamp(-1, 1)


@torch.no_grad()
def decode_audio(audio_vae: AutoencoderKLLTX2Audio, latents: torch.Tensor) -> torch.Tensor:
    """Log-mel spectrograms ``[N, 2, T, mel_bins]`` (fp32) of normalised audio latents ``[N, C, L, M]`` (the
    unpacked form of ``pack_audio``'s tokens), one clip at a time."""
    packed = pack_audio(latents).to(audio_vae.latents_mean.device)  # the statistics are per token feature
    raw = unpack_audio(packed * audio_vae.latents_std + audio_vae.latents_mean, latents.shape[1])
    mels = [audio_vae.decode(clip[None].to(audio_vae.dtype)).sample for clip in raw]
    return torch.cat(mels).float()


def audio_waveforms(audio_vae: AutoencoderKLLTX2Audio, mels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(waveforms [N, 2, S], sample rate)`` of log-mel spectrograms ``[N, 2, T, mel_bins]`` (Griffin-Lim)."""
    cfg = audio_vae.config
    waves = [mel_to_waveform(mel.float().cpu(), sample_rate=cfg.sample_rate, hop_length=cfg.mel_hop_length,
                             n_fft=LTX2Encoders.n_fft) for mel in mels]  # fmt: skip
    return torch.stack(waves), int(cfg.sample_rate)


def load_video_vae(
    options: Any, device: torch.device, dtype: torch.dtype, *, planned: bool = False
) -> AutoencoderKLLTX2Video:
    """The video VAE the cache was encoded with (``data.dataset.preprocess``: ``model_root``'s ``vae/``, or
    the ``release_file``'s weights), frozen, in eval mode on ``device``; ``planned``: its architecture from
    ``vae/config.json`` on meta (no weights read: the planner materializes it)."""
    return _load(AutoencoderKLLTX2Video, "vae", 0, options, device, dtype, planned)


def load_audio_vae(
    options: Any, device: torch.device, dtype: torch.dtype, *, planned: bool = False
) -> AutoencoderKLLTX2Audio:
    """The audio VAE the cache was encoded with (``model_root``'s ``audio_vae/``, or the ``release_file``'s),
    as :func:`load_video_vae`."""
    return _load(AutoencoderKLLTX2Audio, "audio_vae", 1, options, device, dtype, planned)


def _load(cls: Any, folder: str, part: int, options: Any, device: torch.device, dtype: torch.dtype,
          planned: bool) -> Any:  # fmt: skip
    root = Path(options.model_root)
    if not (root / folder).is_dir():
        raise FileNotFoundError(f"data.dataset.preprocess.model_root={root}: missing [{folder!r}]")
    if planned:
        with torch.device("meta"):
            module = cls.from_config(cls.load_config(root / folder))
        return module.to(dtype).eval().requires_grad_(False)
    if options.release_file:
        module = load_release_encoders(options.release_file, root, audio=part == 1, dtype=dtype)[part]
    else:
        module = cls.from_pretrained(root / folder, torch_dtype=dtype)
    return module.to(device=device).eval().requires_grad_(False)


__all__ = ["audio_waveforms", "decode_audio", "decode_video", "load_audio_vae", "load_video_vae"]
