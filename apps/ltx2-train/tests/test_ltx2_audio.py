"""The audio front end: LTX-2's reference log-mel settings, and audio read over the frames' span."""

from __future__ import annotations

import math

import av
import numpy as np
import pytest
import torch
from ltx2_train.audio import log_mel, mel_filterbank, read_audio

SR, HOP, N_FFT, BINS = 16000, 160, 1024, 64


def slaney_hz(mel: np.ndarray) -> np.ndarray:
    # Slaney's scale: linear (200/3 Hz per mel) below 1 kHz = 15 mel, logarithmic above
    return np.where(mel < 15, mel * 200 / 3, 1000 * np.exp((mel - 15) * math.log(6.4) / 27))


def test_filters_are_slaney_scale_triangles_with_slaney_area_normalisation():
    bank = mel_filterbank(SR, N_FFT, BINS).double().numpy()  # [bins, freqs]
    assert bank.shape == (BINS, N_FFT // 2 + 1)
    top = 15 + 27 * math.log(8000 / 1000) / math.log(6.4)  # Nyquist in Slaney mel
    edges = slaney_hz(np.linspace(0, top, BINS + 2))
    freqs = np.linspace(0, SR // 2, N_FFT // 2 + 1)
    for m in (0, 10, 40, 63):
        lo, centre, hi = edges[m : m + 3]
        expected = np.clip(np.minimum((freqs - lo) / (centre - lo), (hi - freqs) / (hi - centre)), 0, None)
        np.testing.assert_allclose(bank[m], expected * 2 / (hi - lo), rtol=1e-5, atol=1e-12)


def test_log_mel_keeps_every_centred_frame_and_puts_a_tone_in_its_mel_bin():
    t = torch.arange(SR) / SR  # 1 s of a 1 kHz tone, stereo
    wave = torch.stack([torch.sin(2 * math.pi * 1000 * t)] * 2)
    mel = log_mel(wave, sample_rate=SR, hop_length=HOP, n_fft=N_FFT, mel_bins=BINS)
    assert mel.shape == (2, SR // HOP + 1, BINS)
    centres = slaney_hz(np.linspace(0, 15 + 27 * math.log(8) / math.log(6.4), BINS + 2))[1:-1]
    assert int(mel[0, 50].argmax()) == int(np.abs(centres - 1000).argmin())
    assert float(mel.min()) >= math.log(1e-5)


@pytest.fixture
def ramp_wav(tmp_path):
    """2 s mono 16 kHz PCM whose sample j is j / 40000 (so the value tells the time)."""
    path = tmp_path / "ramp.wav"
    samples = (np.arange(2 * SR) / 40000.0).astype(np.float32)
    with av.open(str(path), "w") as out:
        stream = out.add_stream("pcm_f32le", rate=SR, layout="mono")
        for start in range(0, len(samples), 1024):
            frame = av.AudioFrame.from_ndarray(
                samples[None, start : start + 1024], format="flt", layout="mono"
            )
            frame.sample_rate = SR
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path


def test_audio_is_read_from_the_first_frames_time_and_zero_padded_past_the_end(ramp_wav):
    wave = read_audio(ramp_wav, SR, 800, start_s=0.5)
    assert wave.shape == (2, 800)
    expected = (torch.arange(8000, 8800) / 40000.0).float()
    torch.testing.assert_close(wave[0], expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(wave[1], expected, rtol=0, atol=1e-6)  # mono -> both channels
    tail = read_audio(ramp_wav, SR, 800, start_s=1.99)
    assert torch.count_nonzero(tail[:, 160:]) == 0 and torch.count_nonzero(tail[:, :160]) > 0
