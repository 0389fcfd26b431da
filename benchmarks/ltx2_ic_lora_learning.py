"""Does an LTX-2 run with IC-LoRA reference tokens learn a transform of its reference clip? (Not a test.)

Issue 46 measurement, in one process, without the trainer. The set (:func:`pair_keys`): 72 tiny clips
(5 frames of 16 x 16 at 8 fps), one shape each, every (shape, direction, lane, radius) of 3 shapes x 4
directions x 3 lanes (offsets across the motion) x 2 radii; 64 of these keys train, their colours balanced
over (direction, radius), and 8 are held out (two per direction, each colour twice; ``--seed`` picks them):
their references are new (shape, direction, lane, radius) combinations of seen colours. Each key is a pair
written as mp4 files (:func:`write_pairs`): the target clip, and its reference, the transform's preimage:

* ``--transform swap`` (the documented run): the reference is the same clip with its colour swapped
  (red <-> green, blue <-> yellow, :data:`SWAP`); the target keeps the reference's shape, positions and
  motion and maps its colour. IC-LoRA places the reference tokens at the target's RoPE positions
  (``ltx2_train.conditioning``), so target token p finds reference token p: identity in space plus a
  colour map, which one attention layer can copy.
* ``--transform reverse``: the reference is the target played backwards (same colour, opposite motion).

One caption for all (:data:`CAPTION`): only the reference tells the targets apart. ``make-tiny``'s model set
gives the text side; its video VAE is fitted here to the 128 training clips (targets and references; the
held-out clips are not shown to it) and cached in ``--out``. The transformer (``--tokens``): ``patch`` is
``ltx2_train.tiny.tiny_transformer`` (patch 1: 3 x 4 x 4 = 48 video tokens of 8 latent channels, 2 blocks,
4 heads x 8), ``one`` is ``one_token_transformer`` (the whole clip one token; issue 46's first trial). It
is built at ``--init-seed`` and trained from scratch (full weights) with ``LTX2Pipeline.forward``
(``reference: video``, audio off) on the 64 pairs in a fixed cyclic order (``--batch`` places per step, each
place's noise and sigma keyed by the place), AdamW, warmup + cosine. Then, for each held-out pair x
``--sample-seeds``, ``sample_clip`` (20 Euler steps) draws a clip with the reference (``--reference``) and
one without it; the evaluator (:func:`follows`) passes a draw when its shape moves as the target moves in
every frame pair (``mm_data.moves_as_captioned``) and the mean colour of its off-background pixels is nearest
the target's of the 4 colours (by hue: :func:`shape_colour`). Chance is about 1/16 (1/4 colours x 1/4
directions). ``--lora-rank R`` trains, instead, a text-to-video base first and then rank-R adapters with the
references (:func:`trained_holder`).

Usage: python benchmarks/ltx2_ic_lora_learning.py [--transform swap|reverse] [--tokens patch|one]
       [--out /tmp/ltx2_ic_lora] [--steps 3000] [--lr 2e-3] [--batch 16] [--warmup 20] [--seed 0]
       [--init-seed 1234] [--vae-fit-steps 4000] [--sample-seeds 0 1] [--lora-rank 0] [--base-steps 1000]
       [--base-lr 2e-3]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

CAPTION = "a shape moving"
COLOURS = ("red", "green", "blue", "yellow")
#: ``--transform swap``'s colour map (an involution: a reference's colour is its target's swapped).
SWAP = {"red": "green", "green": "red", "blue": "yellow", "yellow": "blue"}
SHAPES = ("circle", "square", "diamond")
DIRECTIONS = ("up", "down", "left", "right")
LANES = (-3, 0, 3)
"""Pixel offsets of the path across the motion."""
RADII = (2.0, 3.0)
FRAMES, SIZE, FPS = 5, 16, 8
HELD_OUT = 8
#: ``--lora-rank``'s adapted layers (``configs/tiny_t2av_ic_lora.yaml``'s).
LORA_TARGETS = ["transformer_blocks.{*}.*attn*.to_?", "transformer_blocks.{*}.*attn*.to_out.0",
                "transformer_blocks.{*}.*ff.net.2"]  # fmt: skip


def pair_keys(seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training, held-out) target clips: every (shape, direction, lane, radius), :data:`HELD_OUT` of them held
    out (the first two of each direction in an order shuffled by ``seed``; each colour twice). The others
    train, their colours balanced: in that order, the keys of each (direction, radius) take the colours in
    turn, so that every colour moves every way at every size in training (with colours drawn at random,
    a small green shape moving right trained once, and its held-out draws lost the shape at the edge)."""
    rng = np.random.default_rng(seed)
    keys = [dict(shape=s, direction=d, lane=lane, radius=r)
            for s, d, lane, r in itertools.product(SHAPES, DIRECTIONS, LANES, RADII)]  # fmt: skip
    held: dict[int, str] = {}
    turns: dict[tuple[str, float], int] = {}
    colours: dict[int, str] = {}
    for i in rng.permutation(len(keys)).tolist():
        direction, radius = keys[i]["direction"], keys[i]["radius"]
        if sum(keys[j]["direction"] == direction for j in held) < HELD_OUT // len(DIRECTIONS):
            held[i] = COLOURS[len(held) % len(COLOURS)]
        else:
            turn = turns.get((direction, radius), 0)
            colours[i], turns[direction, radius] = COLOURS[turn % len(COLOURS)], turn + 1
    train = [keys[i] | {"colour": colours[i]} for i in sorted(colours)]
    return train, [keys[i] | {"colour": colour} for i, colour in held.items()]


def clip_frames(colour: str, shape: str, direction: str, lane: int, radius: float) -> np.ndarray:
    """``uint8 [FRAMES, SIZE, SIZE, 3]``: the shape crossing the frame in ``direction``, ``lane`` pixels off
    the centre line, on the synthetic clips' background."""
    from mm_data.synthetic import BACKGROUND
    from mm_data.synthetic import COLOURS as RGB

    dx, dy = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}[direction]
    travel = SIZE - 2 * radius - 2
    yy, xx = np.mgrid[0:SIZE, 0:SIZE] + 0.5
    frames = np.empty((FRAMES, SIZE, SIZE, 3), np.uint8)
    for k in range(FRAMES):
        p = k / (FRAMES - 1) - 0.5
        cx = SIZE / 2 + dx * p * travel + (dx == 0) * lane
        cy = SIZE / 2 + dy * p * travel + (dy == 0) * lane
        ax, ay = np.abs(xx - cx), np.abs(yy - cy)
        mask = {"circle": ax**2 + ay**2 <= radius**2, "square": np.maximum(ax, ay) <= radius,
                "diamond": ax + ay <= radius * 1.4}[shape]  # fmt: skip
        frames[k] = BACKGROUND
        frames[k][mask] = RGB[colour]
    return frames


def write_pairs(folder: Path, keys: list[dict[str, Any]], transform: str) -> Path:
    """Each key's target ``target_i.mp4`` and reference ``reference_i.mp4`` in ``folder``, and the IC-LoRA
    metadata of the targets (``reference`` column) as ``metadata.json``; skipped when its keys are there."""
    from mm_data import write_clip

    metadata = folder / "metadata.json"
    if metadata.is_file() and [row["key"] for row in json.loads(metadata.read_text())] == keys:
        return metadata
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, key in enumerate(keys):
        frames = clip_frames(**key)
        # the transform's preimage: the target played backwards, or its colour swapped back
        reference = (
            frames[::-1] if transform == "reverse" else clip_frames(**key | {"colour": SWAP[key["colour"]]})
        )
        write_clip(folder / f"target_{i:03d}.mp4", frames, FPS)
        write_clip(folder / f"reference_{i:03d}.mp4", np.ascontiguousarray(reference), FPS)
        rows.append({"path": f"target_{i:03d}.mp4", "cap": [CAPTION], "num_frames": FRAMES, "fps": FPS,
                     "resolution": {"height": SIZE, "width": SIZE}, "reference": f"reference_{i:03d}.mp4",
                     "key": key})  # fmt: skip
    metadata.write_text(json.dumps(rows, indent=1))
    return metadata


def shape_colour(frames: np.ndarray) -> str:
    """The one of :data:`COLOURS` whose hue is nearest that of ``uint8 [T, H, W, 3]`` frames' shape: the mean
    of the pixels that differ from the frame's median (the background) by more than 60, less the background,
    against each colour less the background (cosine; a shape's edge pixels, blended with the background,
    dim its mean without turning its hue: a dimmed yellow is nearer red than yellow in plain RGB distance);
    ``none`` when no pixel differs."""
    from mm_data.synthetic import COLOURS as RGB

    pixels = frames.reshape(-1, 3).astype(np.float64)
    background = np.median(pixels, axis=0)
    shape = pixels[np.abs(pixels - background).sum(axis=1) > 60]
    if len(shape) == 0:
        return "none"
    mean = shape.mean(axis=0) - background

    def cosine(colour: str) -> float:
        hue = np.array(RGB[colour], dtype=np.float64) - background
        return float(hue @ mean / (np.linalg.norm(hue) * np.linalg.norm(mean) + 1e-9))

    return max(COLOURS, key=cosine)


def follows(video: torch.Tensor, key: dict[str, Any]) -> tuple[bool, bool]:
    """(moves as the target ``key`` in every frame pair, has its colour) of a clip ``[3, F, H, W]``."""
    from mm_data import moves_as_captioned, to_video_frames

    frames = to_video_frames(video)
    return moves_as_captioned(frames, f"moving {key['direction']}"), shape_colour(frames) == key["colour"]


def steps_along(video: torch.Tensor, direction: str) -> str:
    """The shape's centroid step along ``direction`` in each frame pair of a clip ``[3, F, H, W]``, in pixels
    (what :func:`follows` needs >= 0.25 of; ``nan``: a frame without a shape)."""
    from mm_data import caption_direction, shape_centroids, to_video_frames

    steps = np.diff(shape_centroids(to_video_frames(video)), axis=0) @ np.array(caption_direction(direction))
    return " ".join(f"{x:.1f}" for x in steps)


def build_transformer(tokens: str, seed: int) -> torch.nn.Module:
    """``--tokens``' transformer at ``seed``."""
    from ltx2_train.tiny import one_token_transformer, tiny_transformer

    torch.manual_seed(seed)
    return tiny_transformer() if tokens == "patch" else one_token_transformer()


def train(
    holder: Any,
    data: dict[str, torch.Tensor],
    pipeline: Any,
    *,
    steps: int,
    lr: float,
    batch: int,
    warmup: int,
) -> None:
    """``steps`` AdamW steps (warmup + cosine) of ``pipeline.forward`` on the trainable weights of
    ``holder.model``: place j of the run trains sample ``j % N`` of ``data`` (``latents``, with
    ``reference_latents`` when the pipeline takes references), its noise and sigma keyed by the place."""
    from mm_pipelines import SampleRNG

    model = holder.model
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=lr, weight_decay=0.01)
    decay = lambda s: min(1.0, (s + 1) / max(warmup, 1)) * 0.5 * (1 + math.cos(math.pi * s / steps))  # noqa: E731
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, decay)
    count, start = len(data["latents"]), time.monotonic()
    keys = ["latents", "reference_latents"] if pipeline.reference != "none" else ["latents"]
    for step in range(1, steps + 1):
        model.train()
        places = range(step * batch, (step + 1) * batch)
        index = [p % count for p in places]
        inputs = {
            **{k: data[k][index] for k in keys},
            **{k: v[None].expand(len(index), *v.shape) for k, v in data["text"].items()},
            "frame_rate": torch.full((len(index),), float(FPS)),
        }
        loss = pipeline.forward(holder, SampleRNG(seed=0, step=step, sample_ids=places), **inputs).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        schedule.step()
        if step % 50 == 0:
            print(
                f"step {step} loss {loss.item():.4f} {(time.monotonic() - start) / step:.3f} s/step",
                flush=True,
            )
    model.eval()


def trained_holder(args: argparse.Namespace, data: dict[str, torch.Tensor]) -> tuple[Any, Any]:
    """(holder of the trained transformer, its IC-LoRA pipeline). ``--lora-rank 0``: the transformer trained
    from scratch with the references (full weights). Else first a base: the plain text-to-video run
    (``reference: none``) on every training clip, targets and references, for ``--base-steps``; then rank
    ``--lora-rank`` adapters on its attention and feed-forward output layers (``LORA_TARGETS``, as
    ``configs/tiny_t2av_ic_lora.yaml``) trained with the references, the base frozen."""
    from ltx2_train.pipeline import LTX2Pipeline
    from mm_config import LoraConfig
    from mm_trainer import ModelContainer, inject_lora

    schedule = {"batch": args.batch, "warmup": args.warmup}
    holder = ModelContainer({"model": build_transformer(args.tokens, args.init_seed)}, trainable=("model",))
    ic_lora = LTX2Pipeline.from_options({"audio": False, "reference": "video"})
    if args.lora_rank == 0:
        train(holder, data, ic_lora, steps=args.steps, lr=args.lr, **schedule)
        return holder, ic_lora
    clips = {"latents": torch.cat([data["latents"], data["reference_latents"]]), "text": data["text"]}
    print(f"base: text to video on {len(clips['latents'])} clips", flush=True)
    train(holder, clips, ic_lora.without_reference(), steps=args.base_steps, lr=args.base_lr, **schedule)
    lora = LoraConfig(target_modules=LORA_TARGETS, rank=args.lora_rank, alpha=2.0 * args.lora_rank)
    inject_lora(holder, {"model": lora})
    print(f"IC-LoRA: rank {args.lora_rank} adapters", flush=True)
    train(holder, data, ic_lora, steps=args.steps, lr=args.lr, **schedule)
    return holder, ic_lora


def evaluate(
    name: str, modules: dict[str, Any], folder: Path, keys: list[dict[str, Any]], seeds: list[int]
) -> None:
    """Print each draw of ``keys`` (pairs in ``folder``) x ``seeds``, with and without the reference, and the
    counts that follow the transform."""
    from ltx2_train.sampling import sample_clip

    counts = {True: 0, False: 0}
    size = {"num_frames": FRAMES, "height": SIZE, "width": SIZE}
    for (i, key), seed in itertools.product(enumerate(keys), seeds):
        results, steps = {}, ""
        for with_reference in (True, False):
            reference = str(folder / f"reference_{i:03d}.mp4") if with_reference else None
            video, _ = sample_clip(modules, CAPTION, **size, frame_rate=float(FPS), steps=20, seed=seed,
                                   reference=reference)  # fmt: skip
            results[with_reference] = follows(video, key)
            steps = steps_along(video, key["direction"]) if with_reference else steps
            counts[with_reference] += all(results[with_reference])
        target = f"{key['colour']} {key['shape']} {key['direction']} lane {key['lane']} r {key['radius']:g}"
        print(
            f"{name:9s} {target:36s} {seed:4d}  {str(results[True]):14s} {steps:20s} {results[False]}",
            flush=True,
        )
    draws = len(keys) * len(seeds)
    print(f"{name}: follow the transform {counts[True]} of {draws} with the reference, "
          f"{counts[False]} of {draws} without", flush=True)  # fmt: skip


def main() -> None:
    from ltx2_train.preprocess import LTX2Encoders
    from ltx2_train.references import encode_reference
    from ltx2_train.tiny import load_clips, make_tiny, write_fitted_vae
    from mm_data import sha256_file
    from mm_trainer import fit_summary, reconstruct

    parser = argparse.ArgumentParser()
    parser.add_argument("--transform", choices=("swap", "reverse"), default="swap")
    parser.add_argument("--tokens", choices=("patch", "one"), default="patch")
    parser.add_argument(
        "--out", default="/tmp/ltx2_ic_lora", help="cache of the clips, model set and VAE fit"
    )
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument(
        "--batch", type=int, default=16, help="samples per step (training pair j %% 64 at place j)"
    )
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0, help="the training colours and held-out keys")
    parser.add_argument("--init-seed", type=int, default=1234, help="the transformer's initialisation")
    parser.add_argument(
        "--vae-fit-steps", type=int, default=4000, help="the video VAE's fit to the training clips"
    )
    parser.add_argument(
        "--lora-rank", type=int, default=0, help="0: full weights from scratch; else a base, then LoRA"
    )
    parser.add_argument(
        "--base-steps", type=int, default=1000, help="the text-to-video base's steps (with --lora-rank)"
    )
    parser.add_argument("--base-lr", type=float, default=2e-3)
    parser.add_argument("--sample-seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    train_keys, held_keys = pair_keys(args.seed)
    folders = {"train": out / args.transform / "train", "held-out": out / args.transform / "held_out"}
    metadata = {name: write_pairs(folders[name], keys, args.transform)
                for name, keys in (("train", train_keys), ("held-out", held_keys))}  # fmt: skip
    fit_rows = [{**row, "path": p} for row in json.loads(metadata["train"].read_text())
                for p in (row["path"], row["reference"])]  # fmt: skip
    (folders["train"] / "vae_fit.json").write_text(json.dumps(fit_rows, indent=1))
    write_fitted_vae(out / args.transform / "vae", folders["train"] / "vae_fit.json", steps=args.vae_fit_steps,
                     seed=args.seed)  # fmt: skip
    root = out / args.transform
    make_tiny(root, vae_fit_steps=0)  # the text side; the fitted vae/ above is kept
    encoders = LTX2Encoders.load(root, audio=False, device=torch.device("cpu"), dtype=torch.float32)
    print(fit_summary(root / "vae"))
    for name, keys in (("train", train_keys), ("held-out", held_keys)):
        decoded = reconstruct(encoders.vae, load_clips(metadata[name])).clamp(-1, 1)
        passed = sum(all(follows(v, k)) for v, k in zip(decoded, keys, strict=True))
        print(
            f"the evaluator on the VAE's reconstruction of the {name} targets: {passed} of {len(keys)} pass"
        )
    targets = load_clips(metadata["train"])
    size = {"num_frames": FRAMES, "height": SIZE, "width": SIZE}
    references = [
        str(folders["train"] / row["reference"]) for row in json.loads(metadata["train"].read_text())
    ]
    data = {
        "latents": torch.stack([encoders.encode_video(clip) for clip in targets]),
        "reference_latents": torch.stack([
            encode_reference(encoders, p, sha256_file(p), **size, rate=float(FPS))["reference_latents"]
            for p in references
        ]),
        "text": encoders.encode_text(CAPTION, 16),
    }  # fmt: skip
    holder, pipeline = trained_holder(args, data)
    modules = {"holder": holder, "pipeline": pipeline, "encoders": encoders, "text_len": 16}
    print(
        "\nset       target (colour shape direction lane radius)  seed  with reference: (moves, colour), steps  "
        "without: (moves, colour)"
    )
    evaluate("held-out", modules, folders["held-out"], held_keys, args.sample_seeds)
    evaluate("training", modules, folders["train"], train_keys[:4], args.sample_seeds)


if __name__ == "__main__":
    main()
