"""Audio for the audio VAE: a clip's waveform (or a synthetic tone for silent clips) -> log-mel.

``AutoencoderKLLTX2Audio`` encodes a stereo log-mel spectrogram ``[2, T, mel_bins]``. The front end
follows LTX-2's reference audio processor: magnitude STFT (Hann window of ``n_fft``, centred with
reflect padding, one frame per ``hop_length`` samples, so ``N // hop + 1`` frames), a Slaney-scale
Slaney-normalised mel filterbank from 0 Hz to Nyquist (``transformers.audio_utils.mel_filter_bank``)
and ``log(clamp(mel, 1e-5))``; the audio VAE's config gives the sample rate, hop and mel bins, and
its reference ``n_fft`` is 1024. What a clip without an audio track gets is
``data.dataset.preprocess.missing_audio``'s choice (:mod:`ltx2_train.preprocess`): a refusal, silence
(zeros) or :func:`synthetic_tone`, a deterministic stereo sine whose pitch depends on a number (for the
silent synthetic clips of ``make-tiny``, so that the audio stream still has a sample-dependent target).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from mm_data import MetadataError

from ltx2_train.config_schema import MissingAudio


def has_audio_track(path: str | Path) -> bool | None:
    """Whether the media file at ``path`` has an audio stream (its header only; nothing is decoded); None
    when it cannot be opened (missing, truncated: the clip reader reports it as a failed sample)."""
    import av

    try:
        with av.open(str(path)) as container:
            return bool(container.streams.audio)
    except (av.FFmpegError, OSError):
        return None


def read_audio(
    path: str | Path, sample_rate: int, num_samples: int, start_s: float = 0.0
) -> torch.Tensor | None:
    """``num_samples`` of the clip's audio from ``start_s`` seconds, stereo float ``[2, N]`` at
    ``sample_rate`` (mono duplicated, more channels downmixed, zero-padded past the end); None if
    the clip has no audio track.

    ``start_s`` is the time of the first sampled video frame (``VideoTextDataset`` items'
    ``start_s``), so audio and frames stay in sync. Decoding stops once the span is read.
    """
    import av

    skip = int(round(start_s * sample_rate))
    needed = skip + num_samples
    with av.open(str(path)) as container:
        if not container.streams.audio:
            return None
        mono = container.streams.audio[0].codec_context.channels == 1
        # mono is duplicated below (swresample's mono->stereo upmix would attenuate it by 3 dB)
        resampler = av.AudioResampler(format="fltp", layout="mono" if mono else "stereo", rate=sample_rate)
        chunks, have = [], 0
        for frame in container.decode(audio=0):
            for out in resampler.resample(frame):
                chunks.append(torch.from_numpy(out.to_ndarray()))
                have += chunks[-1].shape[1]
            if have >= needed:
                break
        else:
            chunks += [torch.from_numpy(f.to_ndarray()) for f in resampler.resample(None)]
    wave = torch.cat(chunks, dim=1)[:, skip:needed] if chunks else torch.zeros(2, 0)
    wave = wave.expand(2, -1) if wave.shape[0] == 1 else wave
    return torch.nn.functional.pad(wave, (0, num_samples - wave.shape[1]))


def synthetic_tone(index: int, sample_rate: int, num_samples: int) -> torch.Tensor:
    """Stereo sine ``[2, N]``: 220 Hz x 2^(k/12), k = index mod 12; right channel at half amplitude."""
    freq = 220.0 * 2.0 ** ((index % 12) / 12.0)
    t = torch.arange(num_samples, dtype=torch.float64) / sample_rate
    wave = 0.5 * torch.sin(2 * math.pi * freq * t)
    return torch.stack([wave, 0.5 * wave]).float()


def mel_filterbank(sample_rate: int, n_fft: int, mel_bins: int) -> torch.Tensor:
    """Slaney-scale, Slaney-normalised triangular filters ``[mel_bins, n_fft // 2 + 1]``, 0 Hz to Nyquist."""
    from transformers.audio_utils import mel_filter_bank

    bank = mel_filter_bank(
        num_frequency_bins=n_fft // 2 + 1,
        num_mel_filters=mel_bins,
        min_frequency=0.0,
        max_frequency=sample_rate / 2.0,
        sampling_rate=sample_rate,
        norm="slaney",
        mel_scale="slaney",
    )
    return torch.from_numpy(bank).float().T.contiguous()


def log_mel(
    wave: torch.Tensor, *, sample_rate: int, hop_length: int, n_fft: int, mel_bins: int
) -> torch.Tensor:
    """``[2, N]`` waveform -> ``[2, N // hop_length + 1, mel_bins]`` log-mel spectrogram."""
    window = torch.hann_window(n_fft, dtype=wave.dtype)
    spec = torch.stft(
        wave,
        n_fft,
        hop_length=hop_length,
        window=window,
        center=True,
        pad_mode="reflect",
        return_complex=True,
    ).abs()
    mel = mel_filterbank(sample_rate, n_fft, mel_bins).to(spec.dtype) @ spec  # [2, mel_bins, frames]
    return torch.log(torch.clamp(mel, min=1e-5)).transpose(1, 2).contiguous()


def mel_to_waveform(
    mel: torch.Tensor, *, sample_rate: int, hop_length: int, n_fft: int, iterations: int = 32
) -> torch.Tensor:
    """Invert :func:`log_mel`: ``[2, T, mel_bins]`` log-mel -> stereo waveform ``[2, (T - 1) * hop]``.

    For model sets without a vocoder (the tiny one): the mel filterbank's pseudo-inverse gives a
    magnitude spectrogram, Griffin-Lim (``iterations`` rounds of ``torch.stft`` / ``torch.istft``,
    phases from a fixed start) a waveform for it. Coarse with few mel bins, but it follows the
    spectrogram's pitch and loudness over time.
    """
    bank = mel_filterbank(sample_rate, n_fft, mel.shape[-1]).to(mel.dtype)  # [mel_bins, freqs]
    magnitude = (torch.linalg.pinv(bank) @ mel.exp().transpose(1, 2)).clamp_min(0.0)  # [2, freqs, T]
    window = torch.hann_window(n_fft, dtype=mel.dtype)
    length = (mel.shape[1] - 1) * hop_length
    spec = magnitude.to(torch.complex64)
    for _ in range(iterations):
        wave = torch.istft(spec, n_fft, hop_length=hop_length, window=window, center=True, length=length)
        rebuilt = torch.stft(wave, n_fft, hop_length=hop_length, window=window, center=True,
                             pad_mode="reflect", return_complex=True)  # fmt: skip
        spec = magnitude * torch.exp(1j * rebuilt.angle())
    return torch.istft(spec, n_fft, hop_length=hop_length, window=window, center=True, length=length)


class MissingAudioError(MetadataError):
    """Clips without an audio track in an LTX-2 source with audio, under ``missing_audio: refuse`` (exit 66)."""

    raised_on_every_rank = True  # every rank reads the same headers: rank 0 alone prints it


def clip_waveform(
    path: str | None,
    *,
    sample_rate: int,
    seconds: float,
    start_s: float = 0.0,
    missing: MissingAudio = "refuse",
    tone: int = 0,
) -> torch.Tensor:
    """``seconds`` of the clip's audio from ``start_s`` (its first sampled frame); for a clip without an
    audio track (or no clip, ``path`` None) ``missing`` decides: zeros (``silence``), :func:`synthetic_tone`
    number ``tone`` (``tone``), or :class:`MissingAudioError` (``refuse``)."""
    num_samples = int(round(seconds * sample_rate))
    wave = read_audio(path, sample_rate, num_samples, start_s) if path else None
    if wave is not None:
        return wave
    if missing == "silence":
        return torch.zeros(2, num_samples)
    if missing == "tone":
        return synthetic_tone(tone, sample_rate, num_samples)
    raise MissingAudioError(
        f"{path}: no audio track (data.dataset.preprocess.missing_audio: refuse); expected a clip with sound, "
        "or missing_audio: silence"
    )
