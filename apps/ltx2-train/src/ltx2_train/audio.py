"""Audio for the audio VAE: a clip's waveform (or a synthetic tone for silent clips) -> log-mel.

``AutoencoderKLLTX2Audio`` encodes a stereo log-mel spectrogram ``[2, T, mel_bins]`` with ``T``
= one frame per ``hop_length`` samples. Clips without an audio track (e.g. the synthetic clips of
``make-tiny``) get a deterministic stereo sine tone whose pitch depends on the sample index, so the
audio stream still has a learnable, sample-dependent target. The mel filterbank is the HTK
triangle bank on magnitude STFT with ``log(clamp(mel, 1e-5))``; check it against the reference
mel settings of the audio VAE you fine-tune before a real run.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch


def read_audio(path: str | Path, sample_rate: int, num_samples: int) -> torch.Tensor | None:
    """The first ``num_samples`` of the clip's audio as stereo float ``[2, N]`` at ``sample_rate``; None if silent."""
    import av

    with av.open(str(path)) as container:
        if not container.streams.audio:
            return None
        resampler = av.AudioResampler(format="fltp", layout="stereo", rate=sample_rate)
        chunks = []
        for frame in container.decode(audio=0):
            chunks += [torch.from_numpy(f.to_ndarray()) for f in resampler.resample(frame)]
        chunks += [torch.from_numpy(f.to_ndarray()) for f in resampler.resample(None)]
    wave = torch.cat(chunks, dim=1) if chunks else torch.zeros(2, 0)
    return torch.nn.functional.pad(wave, (0, max(0, num_samples - wave.shape[1])))[:, :num_samples]


def synthetic_tone(index: int, sample_rate: int, num_samples: int) -> torch.Tensor:
    """Stereo sine ``[2, N]``: 220 Hz x 2^(k/12), k = index mod 12; right channel at half amplitude."""
    freq = 220.0 * 2.0 ** ((index % 12) / 12.0)
    t = torch.arange(num_samples, dtype=torch.float64) / sample_rate
    wave = 0.5 * torch.sin(2 * math.pi * freq * t)
    return torch.stack([wave, 0.5 * wave]).float()


def mel_filterbank(sample_rate: int, n_fft: int, mel_bins: int) -> torch.Tensor:
    """HTK triangular filters ``[mel_bins, n_fft // 2 + 1]`` from 0 Hz to Nyquist."""

    def to_mel(hz: torch.Tensor) -> torch.Tensor:
        return 2595.0 * torch.log10(1.0 + hz / 700.0)

    def to_hz(mel: torch.Tensor) -> torch.Tensor:
        return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)

    freqs = torch.linspace(0, sample_rate / 2, n_fft // 2 + 1, dtype=torch.float64)
    edges = to_hz(
        torch.linspace(0.0, float(to_mel(torch.tensor(sample_rate / 2.0))), mel_bins + 2, dtype=torch.float64)
    )
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (freqs[None] - lower) / (centre - lower)
    falling = (upper - freqs[None]) / (upper - centre)
    return torch.clamp(torch.minimum(rising, falling), min=0.0).float()


def log_mel(
    wave: torch.Tensor, *, sample_rate: int, hop_length: int, n_fft: int, mel_bins: int
) -> torch.Tensor:
    """``[2, N]`` waveform -> ``[2, N // hop_length, mel_bins]`` log-mel spectrogram."""
    window = torch.hann_window(n_fft, dtype=wave.dtype)
    spec = torch.stft(
        wave, n_fft, hop_length=hop_length, window=window, center=True, return_complex=True
    ).abs()
    mel = mel_filterbank(sample_rate, n_fft, mel_bins).to(spec.dtype) @ spec  # [2, mel_bins, frames]
    frames = wave.shape[-1] // hop_length
    return torch.log(torch.clamp(mel[..., :frames], min=1e-5)).transpose(1, 2).contiguous()
