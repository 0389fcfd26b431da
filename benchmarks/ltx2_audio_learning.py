"""Does the tiny LTX-2 model learn each caption's tone beside its motion? (Not a test; issue 46.)

``ltx2-train make-tiny``'s model set and four clips (red up, blue down, green left, yellow right), each
clip written with a real audio track (AAC, PyAV): a sine of its own frequency (:data:`TONES`, chosen so
that each peaks in a mel bin of its own of the tiny audio VAE's 16). Preprocess reads that track as it
reads any clip's (``ltx2_train.preprocess.encode_sample`` with the clip's path: ``read_audio``, log-mel).

The tiny audio VAE of ``make-tiny`` is random: the benchmark first reports whether it carries a tone
(the mel bin of maximum energy of ``decode(encode(log-mel))`` against the input's), then fits it to the
four log-mels as ``make-tiny`` fits the video VAE (``mm_trainer.fit_autoencoder``, plain MSE;
``--audio-fit-steps 0``: keep it random) and sets its per-channel latent statistics, and reports again.

Training: ``LTX2Pipeline.forward`` with AdamW as ``ltx2_train.tiny.LEARN_TRAINING`` trains (``--batch``
places per step, clip ``j % 4`` at place ``j``, each place keyed apart; warmup 20 + cosine), with
``--audio-timesteps`` and ``--frozen-modality`` as ``model.pipeline`` takes them (``audio``: the audio
branch frozen as the trainer freezes it, ``ltx2_train.modality.freeze_branch``). Then each caption is
sampled with each of ``--seeds`` (20 Euler steps, ``ltx2_train.sampling.sample_clip``); a draw passes when
the video moves as captioned (``mm_data.moves_as_captioned``) and the decoded log-mel's bin of maximum
energy (mean over channels and time) is the caption's tone's bin. Pass: at least 7 of 8 draws. Each draw's
line also gives where the Griffin-Lim waveform of its log-mel (what ``sample.wav`` holds) peaks, in Hz. It also
prints each stream's loss on the four clips at 4 fixed sigmas (``LTX2Pipeline.validation_loss``: what
``val_loss_video`` / ``val_loss_audio`` log), a comparison free of the training draws' noise.

Usage: python benchmarks/ltx2_audio_learning.py [--out /tmp/ltx2_audio] [--steps 200] [--audio-timesteps shared]
       [--frozen-modality none] [--audio-fit-steps 600] [--seeds 0,1] [--seed 1234]
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from types import SimpleNamespace

import torch

#: The clips' tones (Hz), by clip: the tiny audio VAE's 16 Slaney mel bins (0-8 kHz at 16 kHz) put their
#: energy in bins 0, 3, 7 and 13 (each at least 1.5 nats above its neighbours' bins).
TONES = (150.0, 700.0, 1500.0, 4500.0)


def toned_dataset(root: Path) -> Path:
    """The tiny clips (``make-tiny``'s shapes, frames and rate) with an audio track each, a sine of
    :data:`TONES` (``mm_data.make_synthetic_dataset(tones=...)``), under ``root/data_tones``."""
    from ltx2_train.tiny import AUDIO, CLIP, DEMO_SHAPES
    from mm_data import make_synthetic_dataset

    return make_synthetic_dataset(
        root / "data_tones", num_clips=len(DEMO_SHAPES), sizes=((CLIP["height"], CLIP["width"]),),
        fps=(CLIP["fps"],), num_frames=(CLIP["num_frames"],), shapes=DEMO_SHAPES, tones=TONES,
        sample_rate=AUDIO["sample_rate"],
    )  # fmt: skip


def peak_bin(mel: torch.Tensor) -> int:
    """The mel bin of maximum mean log energy of ``[..., T, mel_bins]``."""
    return int(mel.float().flatten(0, -2).mean(dim=0).argmax())


def peak_hz(wave: torch.Tensor, sample_rate: int) -> float:
    """The frequency (Hz) of the largest magnitude of the left channel's spectrum."""
    spectrum = torch.fft.rfft(wave[0].double()).abs()
    return float(torch.fft.rfftfreq(wave.shape[1], 1 / sample_rate)[spectrum.argmax()])


def carried_bins(audio_vae, mels: torch.Tensor) -> list[int]:
    """The peak bin of ``decode(encode(mel))`` of each ``[N, 2, T, bins]`` log-mel."""
    with torch.no_grad():
        decoded = audio_vae.decode(audio_vae.encode(mels).latent_dist.mode()).sample
    return [peak_bin(d) for d in decoded]


def fit_audio_vae(audio_vae, mels: torch.Tensor, steps: int) -> None:
    """Fit ``audio_vae`` to ``mels`` (cropped to the length it decodes back) and set its latent statistics
    (per packed channel, as ``LTX2Pipeline``'s audio normalisation reads them)."""
    from mm_trainer import fit_autoencoder, posterior_means

    with torch.no_grad():
        length = audio_vae.decode(audio_vae.encode(mels[:1]).latent_dist.mode()).sample.shape[2]
    samples = mels[:, :, :length]
    torch.manual_seed(0)
    audio_vae.requires_grad_(True)  # loaded frozen, as preprocess holds it
    fit_autoencoder(audio_vae, samples, steps=steps, lr=3e-3, batch_size=4, l1_weight=0.0)
    audio_vae.requires_grad_(False)
    z = posterior_means(audio_vae, mels)  # [N, C, L, M] -> packed [N, L, C * M]
    packed = z.transpose(1, 2).flatten(2, 3).flatten(0, 1)
    with torch.no_grad():
        audio_vae.latents_mean.copy_(packed.mean(dim=0))
        audio_vae.latents_std.copy_(packed.std(dim=0).clamp_min(1e-6))


def main() -> None:
    from ltx2_train.audio import log_mel
    from ltx2_train.modality import freeze_branch
    from ltx2_train.pipeline import LTX2Pipeline
    from ltx2_train.preprocess import LTX2Encoders, clip_waveform, encode_sample
    from ltx2_train.sampling import sample_clip, waveform
    from ltx2_train.tiny import CLIP, make_tiny, one_token_transformer
    from mm_data import VideoTextDataset, moves_as_captioned, to_video_frames
    from mm_pipelines import SampleRNG

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/ltx2_audio")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1234, help="the transformer's initialisation")
    parser.add_argument("--seeds", default="0,1", help="sampling seeds, one draw per caption each")
    parser.add_argument("--audio-timesteps", default="shared", choices=("shared", "independent"))
    parser.add_argument("--frozen-modality", default="none", choices=("none", "audio"))
    parser.add_argument("--audio-fit-steps", type=int, default=600, help="0: the random audio VAE")
    args = parser.parse_args()
    torch.set_num_threads(1)
    root = make_tiny(args.out)
    metadata = toned_dataset(root)
    encoders = LTX2Encoders.load(root, audio=True, device=torch.device("cpu"), dtype=torch.float32)
    size = {k: CLIP[k] for k in ("num_frames", "height", "width")}
    clips = VideoTextDataset(metadata, **size, frame_offset="start")
    cfg = encoders.audio_vae.config
    mel_args = dict(sample_rate=cfg.sample_rate, hop_length=cfg.mel_hop_length, n_fft=encoders.n_fft,
                    mel_bins=cfg.mel_bins)  # fmt: skip
    waves = [clip_waveform(str(clips.rows[i]["path"]), sample_rate=cfg.sample_rate,
                           seconds=CLIP["num_frames"] / CLIP["fps"]) for i in range(len(clips))]  # fmt: skip
    mels = torch.stack([log_mel(w, **mel_args) for w in waves])
    tone_bins = [peak_bin(m) for m in mels]
    print(f"tones {TONES} Hz -> mel bins of the clips' tracks {tone_bins}", flush=True)
    print(
        f"random audio VAE: decode(encode(mel)) peak bins {carried_bins(encoders.audio_vae, mels)}",
        flush=True,
    )
    if args.audio_fit_steps:
        start, fitted = time.monotonic(), root / f"audio_vae_fitted_{args.audio_fit_steps}"
        if fitted.is_dir():  # a run before fitted it with these steps (the same clips and seed)
            encoders.audio_vae = type(encoders.audio_vae).from_pretrained(fitted).eval().requires_grad_(False)
        else:
            fit_audio_vae(encoders.audio_vae, mels, args.audio_fit_steps)
            encoders.audio_vae.save_pretrained(fitted)
        print(f"fitted audio VAE ({args.audio_fit_steps} steps, {time.monotonic() - start:.0f} s): peak bins "
              f"{carried_bins(encoders.audio_vae, mels)}", flush=True)  # fmt: skip
    items = [encode_sample(encoders, clips[i], frame_rate=float(CLIP["fps"]), max_length=16,
                           path=str(clips.rows[i]["path"])) for i in range(len(clips))]  # fmt: skip
    captions = [clips[i]["prompt"] for i in range(len(clips))]
    batch = {k: torch.stack([it[k] for it in items]) for k in items[0] if k != "metadata"}
    torch.manual_seed(args.seed)
    model = one_token_transformer()
    if args.frozen_modality != "none":
        freeze_branch(model, args.frozen_modality)
    holder = SimpleNamespace(model=model)
    pipeline = LTX2Pipeline.from_options(
        {"audio": True, "audio_timesteps": args.audio_timesteps, "frozen_modality": args.frozen_modality}
    )
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=0.01)
    decay = lambda s: min(1.0, (s + 1) / args.warmup) * 0.5 * (1 + math.cos(math.pi * s / args.steps))  # noqa: E731
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, decay)
    start, tail = time.monotonic(), []
    for step in range(1, args.steps + 1):
        model.train()
        index = [j % len(items) for j in range(args.batch)]
        places = range(step * args.batch, (step + 1) * args.batch)
        output = pipeline.forward(holder, SampleRNG(seed=0, step=step, sample_ids=places),
                                  **{k: v[index] for k, v in batch.items()})  # fmt: skip
        optimizer.zero_grad()
        output.loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        schedule.step()
        tail = [*tail[-19:], (output.metrics["loss_video"], output.metrics["loss_audio"])]
        if step % 50 == 0:
            video, audio = (sum(x) / len(x) for x in zip(*tail, strict=True))
            print(f"step {step}: loss_video {video:.3f} loss_audio {audio:.3f} (mean of the last {len(tail)}) "
                  f"{(time.monotonic() - start) / step:.2f} s/step", flush=True)  # fmt: skip
    model.eval()
    held = pipeline.validation_loss(holder, batch, SampleRNG(seed=1, step=0, sample_ids=range(len(items))), 4)
    print(f"fixed-sigma loss of the 4 clips (sigmas 1/8 ... 7/8, as val_loss): video {held['loss_video'].mean():.3f} "
          f"audio {held['loss_audio'].mean():.3f}", flush=True)  # fmt: skip
    modules = {"holder": holder, "pipeline": pipeline, "encoders": encoders, "text_len": 16}
    passed, lines = 0, []
    for seed in (int(s) for s in args.seeds.split(",")):
        for caption, tone_bin, tone_hz in zip(captions, tone_bins, TONES, strict=True):
            video, mel = sample_clip(
                modules, caption, **size, frame_rate=float(CLIP["fps"]), steps=20, seed=seed
            )
            moves, got = moves_as_captioned(to_video_frames(video), caption), peak_bin(mel)
            passed += moves and got == tone_bin
            heard = peak_hz(*waveform(encoders, mel))
            lines.append(f"  seed {seed} {caption.split()[1]:6s} moves {'Y' if moves else 'n'} "
                         f"tone bin {got:2d} (caption's {tone_bin:2d}) {'PASS' if moves and got == tone_bin else 'fail'}"
                         f"  | its .wav (Griffin-Lim) peaks at {heard:6.0f} Hz (tone {tone_hz:.0f})")  # fmt: skip
    print("\n".join(lines))
    draws = len(lines)
    verdict = "PASS" if passed >= math.ceil(draws * 7 / 8) else "FAIL"
    print(f"audio_timesteps={args.audio_timesteps} frozen_modality={args.frozen_modality}: {passed} of {draws} "
          f"draws move as captioned with the caption's tone: {verdict}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
