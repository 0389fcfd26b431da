"""Does the tiny Wan2.2 predictor learn the demo's clips, and does it use the caption? (Not a test.)

Issue 22 measurement, in one process, without the trainer: ``make-tiny``'s fitted tiny VAE and tiny
UMT5 on four synthetic clips, then the tiny ``WanTransformer3DModel`` trained with the flow-match
loss of ``mm_pipelines.FlowMatchScheduler`` (per-sample grid indices, Gaussian weighting, shift 3,
AdamW, warmup + cosine, grad clip 1) on the clips' normalized latents. Every ``--every`` steps it
prints the x0 error with each clip's own caption and, as the reference in the same run, with another
clip's caption (a predictor that ignores the caption has the two equal). At the end it samples each
caption (20 Euler steps, two seeds), as trained and with the Euler step's direction inverted, and
prints whether the shape's centroid moves as captioned in every frame pair (``moves_as_captioned``).

Usage: python benchmarks/wan_demo_learning.py [--size 16] [--frames 5] [--fit-steps 300]
       [--steps 1500] [--lr 1e-2] [--captions colour] [--transformer '{"patch_size": [1, 1, 1]}']
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

#: ``--captions``: the four clips' (colour, shape, direction).
CAPTION_SETS = {
    "white": tuple(("white", "circle", d) for d in ("up", "right", "down", "left")),
    "colour": (("red", "circle", "up"), ("blue", "circle", "down"), ("green", "circle", "left"),
               ("yellow", "circle", "right")),
}  # fmt: skip


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=16, help="clip height and width (pixels)")
    parser.add_argument("--frames", type=int, default=5)
    parser.add_argument("--fit-steps", type=int, default=300, help="tiny VAE fit steps")
    parser.add_argument("--steps", type=int, default=1500, help="predictor training steps")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--text-len", type=int, default=8)
    parser.add_argument("--captions", choices=sorted(CAPTION_SETS), default="colour")
    parser.add_argument("--transformer", default='{"patch_size": [1, 1, 1], "num_layers": 3}',
                        help="JSON overrides of the tiny transformer's config")  # fmt: skip
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--workdir", default="/tmp/wan_demo_learning")
    return parser.parse_args()


def main() -> None:
    from diffusers import AutoencoderKLWan
    from mm_data import moves_as_captioned, shape_centroids, to_video_frames
    from mm_pipelines import FlowMatchScheduler
    from mm_trainer import fit_summary
    from transformers import PreTrainedTokenizerFast, UMT5EncoderModel
    from wan22_train.tiny import load_clips, make_tiny, tiny_transformer

    args = parse_args()
    torch.set_num_threads(1)
    clip = {"num_frames": args.frames, "height": args.size, "width": args.size, "fps": 8}
    out = Path(args.workdir) / f"{args.captions}_{args.size}px_{args.frames}f"
    started = time.perf_counter()
    make_tiny(out, num_clips=4, vae_fit_steps=args.fit_steps, shapes=CAPTION_SETS[args.captions], clip=clip)
    print(f"make-tiny {time.perf_counter() - started:.1f} s; {fit_summary(out / 'vae')}")

    vae = AutoencoderKLWan.from_pretrained(out / "vae").eval()
    encoder = UMT5EncoderModel.from_pretrained(out / "text_encoder").eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(out / "tokenizer")
    metadata = out / "data" / "metadata.json"
    captions = [row["cap"][0] for row in json.loads(metadata.read_text())]
    z = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean).view(1, z, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, z, 1, 1, 1)
    with torch.no_grad():
        latents = (vae.encode(load_clips(metadata, clip)).latent_dist.mode() - mean) / std
        tokens = tokenizer(captions, padding="max_length", max_length=args.text_len, return_tensors="pt")
        text = encoder(**tokens).last_hidden_state * tokens["attention_mask"][..., None]
    flat = torch.nn.functional.normalize(text.flatten(1), dim=1)
    print("captions:", captions)
    print("text embedding cosine:\n", (flat @ flat.T).numpy().round(3))
    wrong = text[[1, 0, 3, 2]]

    torch.manual_seed(0)
    # the fitted VAE's channels, 4 heads x 16 (the width of every run in benchmarks/README.md)
    width = {"in_channels": z, "out_channels": z, "attention_head_dim": 16, "ffn_dim": 128}
    model = tiny_transformer(**(width | json.loads(args.transformer)))
    print(
        f"latents {tuple(latents.shape)}; predictor {sum(p.numel() for p in model.parameters())} parameters"
    )
    scheduler = FlowMatchScheduler(shift=3.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    warmup = max(1, args.steps // 50)

    def x0_error(embeddings: torch.Tensor) -> float:
        g, errors = torch.Generator().manual_seed(1), []
        with torch.no_grad():
            for index in (300, 600, 900):
                idx = torch.full((len(latents),), index)
                sigma = scheduler.sigmas_for(idx).view(-1, 1, 1, 1, 1)
                noised = scheduler.add_noise(
                    latents, torch.randn(latents.shape, generator=g), sigma.flatten()
                )
                v = model(noised, scheduler.timesteps_for(idx), embeddings, return_dict=False)[0]
                errors.append(float(((noised - sigma * v - latents) ** 2).mean()))
        return float(np.mean(errors))

    g = torch.Generator().manual_seed(0)
    started = time.perf_counter()
    print("step   loss    x0 err (own caption)  x0 err (other caption)  s/step")
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in optimizer.param_groups:
            group["lr"] = lr
        idx = torch.randint(0, scheduler.num_train_timesteps, (len(latents),), generator=g)
        sigma, weight = scheduler.sigmas_for(idx), scheduler.weights_for(idx)
        noise = torch.randn(latents.shape, generator=g)
        v = model(
            scheduler.add_noise(latents, noise, sigma), scheduler.timesteps_for(idx), text, return_dict=False
        )[0]
        loss = (weight.view(-1, 1, 1, 1, 1) * (v - (noise - latents)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % args.every == 0 or step == args.steps - 1:
            model.eval()
            right, other = x0_error(text), x0_error(wrong)
            model.train()
            per_step = (time.perf_counter() - started) / (step + 1)
            print(
                f"{step:5d}  {loss.item():.4f}  {right:.4f}                {other:.4f}                  {per_step:.3f}"
            )
    model.eval()
    # From pure noise (sigma 1) the predicted x0 is all the predictor knows from the caption: its error
    # against each clip and against the clip played backwards (same caption, opposite direction).
    with torch.no_grad():
        noise = torch.randn(latents.shape, generator=torch.Generator().manual_seed(2))
        x0 = noise - model(noise, torch.full((len(latents),), 1000.0), text, return_dict=False)[0]
    for k, caption in enumerate(captions):
        forward = float(((x0[k] - latents[k]) ** 2).mean())
        backward = float(((x0[k] - latents[k].flip(1)) ** 2).mean())
        print(
            f"x0 at sigma 1, {caption}: error vs clip {forward:.4f}, vs clip reversed in time {backward:.4f}"
        )

    def sample(k: int, seed: int, inverted: bool) -> np.ndarray:
        x = torch.randn((1, *latents.shape[1:]), generator=torch.Generator().manual_seed(seed))
        sampler = FlowMatchScheduler(shift=3.0)
        sampler.set_inference_timesteps(20)
        sigmas = sampler.inference_sigmas
        with torch.no_grad():
            for i, t in enumerate(sampler.inference_timesteps):
                v = model(x, t.reshape(1), text[k : k + 1], return_dict=False)[0]
                x = sampler.step(-v if inverted else v, sigmas[i], sigmas[i + 1], x)
            return to_video_frames(vae.decode(x * std + mean).sample[0].clamp(-1, 1))

    print("caption                        seed  step      moves as captioned  centroids (x, y)")
    for k, caption in enumerate(captions):
        for seed in (0, 1):
            for inverted in (False, True):
                frames = sample(k, seed, inverted)
                moved = moves_as_captioned(frames, caption)
                centroids = shape_centroids(frames).round(1).tolist()
                print(
                    f"{caption:30s} {seed:4d}  {'inverted' if inverted else 'as-is':8s}  {moved!s:18s}  {centroids}"
                )


if __name__ == "__main__":
    main()
