"""A generated waveform (a sampled clip's audio) written as a WAV file."""

from __future__ import annotations

import wave as wav
from pathlib import Path

import torch

__all__ = ["write_wav"]


def write_wav(path: str | Path, wave: torch.Tensor, sample_rate: int) -> Path:
    """Write ``wave`` ``[channels, N]`` of floats in ``[-1, 1]`` (peak-normalised when louder) as 16-bit
    PCM WAV at ``path`` (folders made). Returns ``path``."""
    if wave.ndim != 2:
        raise ValueError(f"expected a waveform [channels, N], got shape {tuple(wave.shape)}")
    wave = wave.detach().float().cpu()
    peak = float(wave.abs().max()) if wave.numel() else 0.0
    samples = (wave / max(peak, 1.0) * 32767).round().to(torch.int16).T.contiguous()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with wav.open(str(path), "wb") as out:
        out.setnchannels(wave.shape[0])
        out.setsampwidth(2)
        out.setframerate(int(sample_rate))
        out.writeframes(samples.numpy().tobytes())
    return path
