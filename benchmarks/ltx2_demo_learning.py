"""Does the tiny one-token LTX-2 predictor learn the four tiny clips? (Not a test.)

Issue 22 measurement, in one process, without the trainer: ``ltx2-train make-tiny``'s model set
(video VAE fitted to the clips, one-token transformer) and its clips encoded as ``preprocess``
does; then ``LTX2Pipeline.forward`` (the training loss, audio on unless ``--no-audio``) with AdamW
(lr, weight decay 0.01, grad clip 1) as ``ltx2_train.tiny.LEARN_TRAINING`` trains: ``--batch`` samples per
step, clip ``j % 4`` at place ``j``, each place a sample of its own in the global order (its own noise
and sigma, as the trainer keys them), warmup + cosine (``--warmup 0``: constant lr). Every ``--every`` steps it samples each clip's
caption with ``ltx2_train.sampling.sample_clip`` (20 Euler steps) as trained and with the Euler
step's direction inverted and prints which captions move as captioned (``moves_as_captioned``) and
the PSNR against the VAE's reconstruction of the clip.

Usage: python benchmarks/ltx2_demo_learning.py [--out /tmp/ltx2_learn] [--steps 200] [--every 100] [--lr 2e-3]
       [--batch 16] [--warmup 20] [--no-audio] [--seed 1234] [--transformer attention_head_dim=96,cross_attention_dim=384]
"""

from __future__ import annotations

import argparse
import math
import time
from types import SimpleNamespace

import torch


def main() -> None:
    from ltx2_train.pipeline import LTX2Pipeline
    from ltx2_train.preprocess import LTX2Encoders, encode_sample
    from ltx2_train.sampling import sample_clip
    from ltx2_train.tiny import (
        CLIP,
        load_clips,
        make_tiny,
        one_token_patch,
        one_token_transformer,
        tiny_transformer,
    )
    from mm_data import VideoTextDataset, moves_as_captioned, psnr, sha256_file, to_video_frames
    from mm_pipelines import FlowMatchScheduler, SampleRNG
    from mm_trainer import reconstruct

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/ltx2_learn")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--batch", type=int, default=16, help="samples per step (clip j %% 4 at place j)")
    parser.add_argument("--seed", type=int, default=1234, help="the transformer's initialisation")
    parser.add_argument(
        "--warmup", type=int, default=20, help="linear warmup steps, then cosine decay (0: constant lr)"
    )
    parser.add_argument("--no-audio", action="store_true", help="train and sample video only")
    parser.add_argument(
        "--transformer", default="", help="overrides of the one-token tiny transformer, k=int,..."
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = make_tiny(args.out)
    audio = not args.no_audio
    encoders = LTX2Encoders.load(out, audio=audio, device=torch.device("cpu"), dtype=torch.float32)
    size = {k: CLIP[k] for k in ("num_frames", "height", "width")}
    clips = VideoTextDataset(out / "data" / "metadata.json", **size, frame_offset="start")
    items = [  # as preprocess encodes them: a silent clip's tone follows its content
        encode_sample(encoders, {**clips[i], "clip_sha256": sha256_file(clips.rows[i]["path"])}, frame_rate=8.0,
                      max_length=16, missing_audio="tone")
        for i in range(len(clips))
    ]  # fmt: skip
    captions = [clips[i]["prompt"] for i in range(len(clips))]  # what preprocess caches (caption at epoch 0)
    print(captions, flush=True)
    batch = {k: torch.stack([it[k] for it in items]) for k in items[0] if k != "metadata"}
    reference = reconstruct(encoders.vae, load_clips(out / "data" / "metadata.json")).clamp(-1, 1)
    torch.manual_seed(args.seed)
    overrides = {k: int(v) for k, v in (kv.split("=") for kv in args.transformer.split(",") if kv)}
    model = one_token_transformer() if not overrides else tiny_transformer(**(one_token_patch() | overrides))
    holder = SimpleNamespace(model=model)
    pipeline = LTX2Pipeline.from_options({"audio": audio, "timestep_sampling": "shifted_logit_normal"})
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    if args.warmup:
        decay = lambda s: min(1.0, (s + 1) / args.warmup) * 0.5 * (1 + math.cos(math.pi * s / args.steps))  # noqa: E731
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, decay)
    modules = {"holder": holder, "pipeline": pipeline, "encoders": encoders, "text_len": 16}
    start = time.monotonic()
    for step in range(1, args.steps + 1):
        model.train()
        index = [j % len(items) for j in range(args.batch)]
        places = range(step * args.batch, (step + 1) * args.batch)  # global order: one key per place
        sub = {k: v[index] for k, v in batch.items()}
        output = pipeline.forward(holder, SampleRNG(seed=0, step=step, sample_ids=places), **sub)
        loss = output.loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if args.warmup:
            schedule.step()
        if step % args.every == 0:
            elapsed = time.monotonic() - start
            model.eval()
            report = []
            for inverted in (False, True):
                euler, original = FlowMatchScheduler.step, FlowMatchScheduler.__dict__["step"]
                if inverted:
                    FlowMatchScheduler.step = staticmethod(lambda v, s, n, x, f=euler: f(-v, s, n, x))
                try:
                    moved = []
                    for i, caption in enumerate(captions):
                        video, _ = sample_clip(modules, caption, **size, frame_rate=8.0, steps=20, seed=0)
                        ok = moves_as_captioned(to_video_frames(video), caption)
                        moved.append(
                            f"{caption.split()[1]}:{'Y' if ok else 'n'}:{psnr(video, reference[i]):.1f}"
                        )
                finally:
                    FlowMatchScheduler.step = original
                report.append(("inverted " if inverted else "") + " ".join(moved))
            print(
                f"step {step} loss {loss.item():.3f} (video {output.metrics['loss_video']:.3f}) {elapsed / step:.3f} s/step | "
                + " | ".join(report),
                flush=True,
            )


if __name__ == "__main__":
    main()
