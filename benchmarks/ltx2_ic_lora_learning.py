"""Does an LTX-2 run with IC-LoRA reference tokens learn a transform of its reference clip? (Not a test.)

Issue 46 measurement, in one process, without the trainer: ``ltx2-train make-tiny``'s model set written for
all 16 (colour, direction) circles of the tiny clips (video VAE fitted to them), whose IC-LoRA source pairs
each clip (the target) with its reference, the same circle moving the opposite way
(``ltx2_train.tiny.write_ic_lora_references``): the transform to learn is "reverse the motion, keep the
colour". Every caption is the same (:data:`CAPTION`), so only the reference tells the target apart.
``LTX2Pipeline.forward`` with ``reference: video`` (audio off) trains the one-token transformer (randomly
initialised: there is no pretrained tiny base for adapters to adapt, so its full weights train) on 12 of
the 16 pairs with AdamW, warmup + cosine, as ``benchmarks/ltx2_demo_learning.py``. Then, for the 4
held-out pairs (:data:`HELD_OUT`: one per colour and direction, references never seen as references) x 2
seeds, ``sample_clip`` (20 Euler steps) draws a clip with the reference (``--reference``) and one
without it; a draw follows the transform when its circle moves as the target's caption says
(``mm_data.moves_as_captioned``) and has the reference's colour (the nearest of the synthetic colours to
the mean of the pixels off the background).

Usage: python benchmarks/ltx2_ic_lora_learning.py [--out /tmp/ltx2_ic_lora] [--steps 300] [--lr 2e-3]
       [--batch 16] [--warmup 20] [--seed 1234] [--vae-fit-steps 700]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from types import SimpleNamespace

import numpy as np
import torch

CAPTION = "a circle moving"
#: (colour, target direction) pairs held out of training: one per colour and per direction.
HELD_OUT = {("red", "up"), ("blue", "down"), ("green", "left"), ("yellow", "right")}
COLOURS = ("red", "blue", "green", "yellow")
DIRECTIONS = ("up", "down", "left", "right")


def shape_colour(frames: np.ndarray) -> str:
    """The synthetic colour nearest to the mean of the pixels that differ from the frame's median (the
    background) in ``uint8 [T, H, W, 3]`` frames."""
    from mm_data.synthetic import COLOURS as RGB

    pixels = frames.reshape(-1, 3).astype(np.float64)
    background = np.median(pixels, axis=0)
    shape = pixels[np.abs(pixels - background).sum(axis=1) > 60]
    if len(shape) == 0:
        return "none"
    mean = shape.mean(axis=0)
    return min(COLOURS, key=lambda c: float(np.sum((np.array(RGB[c], dtype=np.float64) - mean) ** 2)))


def follows(video: torch.Tensor, colour: str, direction: str) -> tuple[bool, bool]:
    """(moves in ``direction``, has ``colour``) of a sampled clip ``[3, F, H, W]``."""
    from mm_data import moves_as_captioned, to_video_frames

    frames = to_video_frames(video)
    return moves_as_captioned(frames, f"a {colour} circle moving {direction}"), shape_colour(frames) == colour


def main() -> None:
    from ltx2_train.pipeline import LTX2Pipeline
    from ltx2_train.preprocess import LTX2Encoders
    from ltx2_train.references import encode_reference
    from ltx2_train.sampling import sample_clip
    from ltx2_train.tiny import CLIP, IC_LORA_METADATA, load_clips, make_tiny, one_token_transformer
    from mm_data import VideoTextDataset, sha256_file
    from mm_pipelines import SampleRNG
    from mm_trainer import fit_summary, reconstruct

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/ltx2_ic_lora")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument(
        "--batch", type=int, default=16, help="samples per step (training pair j %% 12 at place j)"
    )
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1234, help="the transformer's initialisation")
    parser.add_argument("--vae-fit-steps", type=int, default=700, help="make-tiny's VAE fit to the 16 clips")
    args = parser.parse_args()
    torch.set_num_threads(1)
    shapes = [(c, "circle", d) for c, d in itertools.product(COLOURS, DIRECTIONS)]
    out = make_tiny(args.out, shapes=shapes, vae_fit_steps=args.vae_fit_steps)
    encoders = LTX2Encoders.load(out, audio=False, device=torch.device("cpu"), dtype=torch.float32)
    size = {k: CLIP[k] for k in ("num_frames", "height", "width")}
    clips = VideoTextDataset(out / "data" / "metadata.json", **size, frame_offset="start")
    rows = json.loads((out / "data" / IC_LORA_METADATA).read_text())
    references = [str(out / "data" / row["reference"]) for row in rows]
    targets = torch.stack([encoders.encode_video(clips[i]["video"]) for i in range(len(rows))])
    refs = torch.stack([
        encode_reference(encoders, path, sha256_file(path), **size, rate=float(CLIP["fps"]))["reference_latents"]
        for path in references
    ])  # fmt: skip
    text = encoders.encode_text(CAPTION, 16)
    print(fit_summary(out / "vae"))
    decoded = reconstruct(encoders.vae, load_clips(out / "data" / "metadata.json")).clamp(-1, 1)
    truth = {(c, d): follows(decoded[i], c, d) for i, (c, _, d) in enumerate(shapes)}
    misses = {key: result for key, result in truth.items() if not all(result)}
    print(f"the check on the VAE's reconstruction of each target clip: {len(truth) - len(misses)} of {len(truth)} "
          f"follow; (moves, colour) of the others: {misses}", flush=True)  # fmt: skip
    train = [i for i, (c, _, d) in enumerate(shapes) if (c, d) not in HELD_OUT]
    held_out = [i for i, (c, _, d) in enumerate(shapes) if (c, d) in HELD_OUT]
    torch.manual_seed(args.seed)
    model = one_token_transformer()
    holder = SimpleNamespace(model=model)
    pipeline = LTX2Pipeline.from_options({"audio": False, "reference": "video"})
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    decay = lambda s: min(1.0, (s + 1) / max(args.warmup, 1)) * 0.5 * (1 + math.cos(math.pi * s / args.steps))  # noqa: E731
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, decay)
    start = time.monotonic()
    for step in range(1, args.steps + 1):
        model.train()
        index = [train[j % len(train)] for j in range(args.batch)]
        batch = {
            "latents": targets[index], "reference_latents": refs[index],
            **{k: v[None].expand(len(index), *v.shape) for k, v in text.items()},
            "frame_rate": torch.full((len(index),), float(CLIP["fps"])),
        }  # fmt: skip
        places = range(step * args.batch, (step + 1) * args.batch)
        loss = pipeline.forward(holder, SampleRNG(seed=0, step=step, sample_ids=places), **batch).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 50 == 0:
            print(
                f"step {step} loss {loss.item():.4f} {(time.monotonic() - start) / step:.3f} s/step",
                flush=True,
            )
    model.eval()
    modules = {"holder": holder, "pipeline": pipeline, "encoders": encoders, "text_len": 16}
    print("\nset        colour  target  seed  with reference (moves, colour)  without (moves, colour)")
    for name, rows_of in (("held-out", held_out), ("training", train[:4])):
        counts = {True: 0, False: 0}
        for i, seed in itertools.product(rows_of, (0, 1)):
            colour, _, direction = shapes[i]
            results = {}
            for with_reference in (True, False):
                video, _ = sample_clip(modules, CAPTION, **size, frame_rate=float(CLIP["fps"]), steps=20, seed=seed,
                                       reference=references[i] if with_reference else None)  # fmt: skip
                results[with_reference] = follows(video, colour, direction)
                counts[with_reference] += all(results[with_reference])
            print(
                f"{name:10s} {colour:7s} {direction:7s} {seed:4d}  {str(results[True]):30s}  {results[False]}"
            )
        draws = 2 * len(rows_of)
        print(f"{name}: follow the transform {counts[True]} of {draws} with the reference, "
              f"{counts[False]} of {draws} without", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
