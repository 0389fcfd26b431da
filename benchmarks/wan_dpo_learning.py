"""Does Diffusion-DPO on colour-ranked pairs move the tiny Wan2.2 model toward the preferred colour?

Not a test.

Issue 47 measurement, one CPU process, through the trainer (``tiny_dpo.yaml`` at 1 rank): ``make-tiny``'s
model set (VAE not fitted unless ``--vae-fit-steps``) and ``make-pairs``' pairs of its clips: of two clips the
one whose mean colour is closer to ``--target`` is preferred, both captions stripped of their colour word
(``wan22_train.pairs``). A LoRA policy trains on ``train.json`` against its base (adapters off). Every
``--every`` steps, validation gives:

- ``val_loss``: the DPO loss of the held-out pairs (``held_out.json``, never trained on): ``log 2`` for the
  reference itself; below it the held-out mean implicit reward margin is > 0 (the loss is convex and
  decreasing in the margin);
- ``val_reward``: the mean ``colour_target`` reward of 8 held-out colourless prompts x 4 seeds (4-step ODE
  samples decoded by the VAE), ``val_reward_colour_target_std`` their spread: do samples move toward the
  preferred colour?

The reference is the same prompts and seeds before training (the policy as built, one step at lr 0). With
``--control`` each training row's preferred and rejected clips are swapped with probability 1/2 (seeded):
rows that carry no preference, which should move neither number.

Usage: python benchmarks/wan_dpo_learning.py --out /tmp/dpo_bench [--steps 100] [--every 25]
       [--target 1 0 0] [--lr 1e-3] [--beta 500] [--vae-fit-steps 0] [--control]
"""

from __future__ import annotations

import argparse
import json
import random
from functools import partial
from pathlib import Path

from tiny_wan_runs import HELD_OUT, SEEDS, run_on_tiny, start_and_run, tiny_run_parser


def parse_args() -> argparse.Namespace:
    parser = tiny_run_parser(__doc__.split("\n")[0], steps=100)
    parser.add_argument("--lr", type=float, default=None, help="training.lr (default: the config's)")
    parser.add_argument(
        "--beta", type=float, default=None, help="model.pipeline.dpo.beta (default: the config's)"
    )
    parser.add_argument("--control", action="store_true", help="preferred / rejected swapped at random")
    return parser.parse_args()


def swap_at_random(pairs: Path, seed: int = 0) -> Path:
    """``pairs`` with each pair's roles swapped with probability 1/2 (``train_control.json`` beside it)."""
    rows, draw = json.loads(pairs.read_text()), random.Random(seed)
    for row in rows:
        if draw.random() < 0.5:
            row["preferred"], row["rejected"] = row["rejected"], row["preferred"]
    path = pairs.with_name("train_control.json")
    path.write_text(json.dumps(rows, indent=1))
    return path


def train(
    tiny: Path, pairs: Path, run: Path, *, args: argparse.Namespace, steps: int, every: int, lr: float | None
) -> list[dict]:
    """One run of ``tiny_dpo.yaml`` at 1 rank on ``pairs``, validated on the held-out pairs too."""
    overrides = [
        f"data.data_path={pairs}", f"training.validation.data_path={tiny / 'pairs' / 'held_out.json'}",
        *([f"training.lr={lr}"] if lr is not None else []),
        *([f"model.pipeline.dpo.beta={args.beta}"] if args.beta is not None else []),
    ]  # fmt: skip
    return run_on_tiny(
        "tiny_dpo.yaml", tiny, run, steps=steps, every=every, target=args.target, overrides=overrides
    )


def main() -> None:
    args = parse_args()
    from wan22_train.pairs import make_colour_pairs
    from wan22_train.tiny import make_tiny

    tiny = make_tiny(args.out / "tiny", vae_fit_steps=args.vae_fit_steps)
    pairs, held_out = make_colour_pairs(tiny, args.target)
    if args.control:
        pairs = swap_at_random(pairs)
    first, records, seconds = start_and_run(
        partial(train, tiny, pairs, args=args), args.out, "run_control" if args.control else "run",
        steps=args.steps, every=args.every, lr=args.lr, port=29733,
    )  # fmt: skip
    count = (len(json.loads(pairs.read_text())), len(json.loads(held_out.read_text())))
    print(f"{seconds:.0f} s for {args.steps} steps{' (control: roles swapped at random)' if args.control else ''}; "
          f"{count[0]} training rows, {count[1]} held-out rows; {len(HELD_OUT)} prompts x {len(SEEDS)} seeds")  # fmt: skip
    print("step  held-out DPO loss (log 2 = 0.69315)  val_reward  val_std  | train dpo_margin  dpo_accuracy")
    print(
        f"{0:4d}  {first['val_loss']:.5f}  {first['val_reward']:.5f}  {first['val_reward_colour_target_std']:.5f}  |"
    )
    last = 0
    for r in records:
        if "val_reward" in r:
            window = [x for x in records if last < x["step"] <= r["step"]]
            margin = sum(x["dpo_margin"] for x in window) / len(window)
            accuracy = sum(x["dpo_accuracy"] for x in window) / len(window)
            print(f"{r['step']:4d}  {r['val_loss']:.5f}  {r['val_reward']:.5f}  {r['val_reward_colour_target_std']:.5f}  | "
                  f"{margin:.4f}  {accuracy:.3f}")  # fmt: skip
            last = r["step"]


if __name__ == "__main__":
    main()
