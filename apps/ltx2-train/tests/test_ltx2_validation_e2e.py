"""``training.validation`` on a tiny LTX-2 run: clips with their audio and ``val_loss``, the same at any layout.

The reference trains 4 steps of ``tiny_t2av.yaml`` (a global batch of the 4 clips) at 2 ranks with Ulysses 2 and validates after steps 2 and
4: two prompts sampled in 2 steps at 5 x 16 x 16 and 8 fps (each clip's mp4 and its audio's wav), and
``val_loss`` on the tiny cache's 4 samples at 2 fixed sigmas (the training cache as held-out data: the
plumbing, not a generalisation measure); it also logs to an offline W&B run. Runs at 1 rank (no Ulysses) and
at 2 data-parallel ranks validate after step 4 only and write the reference's step-4 clips and its
``val_loss`` (rel 1e-4, as the training losses): the same frames up to one level of 8-bit rounding, and
audio whose log-mel spectrogram is the reference's (mean difference under 0.01, where the two prompts' differ
by 0.25; the waveforms themselves differ by a few percent: Griffin-Lim's phase retrieval amplifies the
float rounding that differs between layouts).

Each run is ``ltx2-train``'s ``main`` on forked gloo ranks (the ``main_forked`` fixture).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from mm_data import decode_frames

pytestmark = pytest.mark.slow

PROMPTS = ("A red circle slides up across a dark grey background.", "a blue circle moving down")
LAYOUTS = {"world1": (1, 1), "world2_dp2": (2, 1)}


def validation(tiny: Path, interval: int) -> dict:
    """The section: the video unguided, the audio guided against the empty prompt (``audio_guidance_scale``
    reaches the container's ``sample`` through the trainer; what it does: ``test_ltx2_sample_guidance.py``)."""
    return {"interval": interval, "prompts": list(PROMPTS), "seeds": [5, 6], "num_frames": 5, "height": 16,
            "width": 16, "sampling_steps": 2, "fps": 8, "loss_timesteps": 2, "data_path": str(tiny / "latents"),
            "audio_guidance_scale": 2.0}  # fmt: skip


def train(
    ltx2_train, run_config, tiny: Path, log_dir: Path, world: int, ulysses: int, **training
) -> list[dict]:
    """4 steps of ``tiny_t2av.yaml`` (every clip in each step, 2 per micro-batch) at ``world`` ranks, Ulysses
    ``ulysses``; returns the metrics records."""
    config = run_config(tiny, train_iters=4, save=None, log_dir=str(log_dir), deterministic=True, micro_batch_size=2,
                        global_batch_size=4, gradient_accumulation_steps=None, **training)  # fmt: skip
    text = yaml.safe_load(config.read_text())
    text["parallel"]["ulysses_parallel_size"] = ulysses
    config.write_text(yaml.safe_dump(text, sort_keys=False))
    ltx2_train("--config", str(config), nproc=world)
    return [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(tiny_cache, ltx2_train, run_config) -> dict:
    log_dir = tiny_cache / "validated"
    wandb = {"project": "ltx2-tests", "mode": "offline"}
    records = train(
        ltx2_train, run_config, tiny_cache, log_dir, 2, 2, validation=validation(tiny_cache, 2), wandb=wandb
    )
    return {"log_dir": log_dir, "records": records}


def written(log_dir: Path, step: int) -> list[str]:
    return sorted(p.name for p in (log_dir / "validation" / f"iter_{step:07d}").iterdir())


def frames(clip: Path) -> np.ndarray:
    return decode_frames(clip, list(range(5)), 16, 16).astype(np.int16)


def samples(path: Path) -> tuple[int, int, np.ndarray]:
    """``(channels, rate, samples [N, channels])`` of a 16-bit WAV file."""
    with wave.open(str(path)) as wav:
        data = np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16)
        return wav.getnchannels(), wav.getframerate(), data.reshape(-1, wav.getnchannels())


def spectrogram(tiny: Path, path: Path) -> torch.Tensor:
    """The log-mel of a written WAV file, as the audio VAE's front end computes it."""
    from ltx2_train.audio import log_mel

    config = json.loads((tiny / "audio_vae" / "config.json").read_text())
    _, rate, data = samples(path)
    wave_ = torch.from_numpy(data.T.astype(np.float32) / 32767)
    return log_mel(
        wave_, sample_rate=rate, hop_length=config["mel_hop_length"], n_fft=1024, mel_bins=config["mel_bins"]
    )


def test_the_reference_writes_clips_with_audio_and_a_finite_val_loss_at_every_second_step(reference):
    log_dir, records = reference["log_dir"], reference["records"]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for step in (2, 4):
        assert written(log_dir, step) == ["0.mp4", "0.wav", "1.mp4", "1.wav"]
    first, second = (frames(log_dir / "validation" / "iter_0000004" / f"{i}.mp4") for i in (0, 1))
    assert first.shape == (5, 16, 16, 3) and first.std() > 1 and not np.array_equal(first, second)
    channels, rate, data = samples(log_dir / "validation" / "iter_0000004" / "0.wav")
    assert channels == 2 and len(data) >= rate * 5 / 8 * 0.9 and np.abs(data).max() > 0  # 5 frames at 8 fps
    val = {r["step"]: r["val_loss"] for r in records if "val_loss" in r}
    assert list(val) == [2, 4] and all(math.isfinite(v) and v > 0 for v in val.values()) and val[2] != val[4]
    for record in records:  # each stream's held-out MSE beside it (audio_loss_weight 1: their sum)
        if "val_loss" in record:
            assert record["val_loss_video"] > 0 and record["val_loss_audio"] > 0
            assert record["val_loss"] == pytest.approx(
                record["val_loss_video"] + record["val_loss_audio"], rel=1e-6
            )


def test_the_reference_logs_its_losses_clips_and_audio_to_its_offline_wandb_run(reference):
    log_dir, records = reference["log_dir"], reference["records"]
    [run_file] = (log_dir / "wandb").glob("offline-run-*/run-*.wandb")
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_file)],
                         capture_output=True, text=True, check=True, timeout=120)  # fmt: skip
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    history = {r["history"]["step"]["num"]: r["history"]["item"] for r in lines if r["type"] == "history"}
    assert sorted(history) == [1, 2, 3, 4]
    for record in records:
        assert history[record["step"]]["train/loss"] == record["loss"]
        if "val_loss" in record:
            assert history[record["step"]]["train/val_loss"] == record["val_loss"]
    for step in (2, 4):
        kinds = {k: v for k, v in history[step].items() if k.endswith("._type")}
        assert kinds == {"validation/0._type": "video-file", "validation/0_audio._type": "audio-file",
                         "validation/1._type": "video-file", "validation/1_audio._type": "audio-file"}  # fmt: skip


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_run_at_another_layout_writes_the_reference_clips_audio_and_val_loss(
    reference, tiny_cache, ltx2_train, run_config, layout
):
    world, ulysses = LAYOUTS[layout]
    log_dir = tiny_cache / f"validated_{layout}"
    records = train(
        ltx2_train, run_config, tiny_cache, log_dir, world, ulysses, validation=validation(tiny_cache, 4)
    )
    expected = reference["records"]
    assert [r["loss"] for r in records] == pytest.approx([r["loss"] for r in expected], rel=1e-4)
    assert [p.name for p in (log_dir / "validation").iterdir()] == ["iter_0000004"]
    assert written(log_dir, 4) == written(reference["log_dir"], 4)
    ours, theirs = (
        log_dir / "validation" / "iter_0000004",
        reference["log_dir"] / "validation" / "iter_0000004",
    )
    for index in (0, 1):
        assert np.abs(frames(ours / f"{index}.mp4") - frames(theirs / f"{index}.mp4")).max() <= 1
        assert samples(ours / f"{index}.wav")[2].shape == samples(theirs / f"{index}.wav")[2].shape
        mel, expected_mel = (spectrogram(tiny_cache, d / f"{index}.wav") for d in (ours, theirs))
        assert (mel - expected_mel).abs().mean() < 0.01
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    assert [step for step, _ in val] == [4]
    for name in ("val_loss", "val_loss_video", "val_loss_audio"):
        assert records[3][name] == pytest.approx(expected[3][name], rel=1e-4)
