"""Does Flow-GRPO raise the colour reward of held-out prompts on the tiny Wan2.2 model? (Not a test.)

Issue 47 measurement, one CPU process, through the trainer (``tiny_grpo.yaml`` at 1 rank): ``make-tiny``'s
model set (VAE not fitted unless ``--vae-fit-steps``), its clips with their captions stripped of the colour
word (the prompts name a shape and a direction only), a LoRA policy trained with Flow-GRPO on the
``colour_target`` reward (closeness of the decoded clip's mean colour to ``--target``). Validation samples
8 held-out colourless prompts (shape x direction pairs) x 4 seeds with the ODE sampler every ``--every``
steps and scores them with the same reward: ``val_reward`` is their mean, ``val_reward_colour_target_std``
their spread. With ``--shuffle`` the control: each rollout's rewards are permuted at random across the
step's clips before the advantages (a reward that carries no information about the clip).

Usage: python benchmarks/wan_grpo_learning.py --out /tmp/grpo_bench [--steps 200] [--every 25]
       [--target 1 0 0] [--lr 1e-2] [--vae-fit-steps 0] [--noise-level 0.7] [--kl-weight 0.04] [--shuffle]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

HELD_OUT = [
    f"a {shape} moving {d}" for shape in ("circle", "square") for d in ("up", "down", "left", "right")
]
SEEDS = (0, 1, 2, 3)


def tiny_run_parser(description: str, *, steps: int) -> argparse.ArgumentParser:
    """The options of a learning run on the tiny set: ``--out``, ``--steps``, ``--every``, ``--target``,
    ``--vae-fit-steps``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, required=True, help="a folder for the tiny set and the run")
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--every", type=int, default=25, help="validate every this many steps")
    parser.add_argument("--target", type=float, nargs=3, default=[1.0, 0.0, 0.0])
    parser.add_argument("--vae-fit-steps", type=int, default=0)
    return parser


def parse_args() -> argparse.Namespace:
    parser = tiny_run_parser(__doc__.split("\n")[0], steps=200)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--noise-level", type=float, default=0.7, help="model.pipeline.grpo.noise_level")
    parser.add_argument("--kl-weight", type=float, default=0.04, help="model.pipeline.grpo.kl_weight")
    parser.add_argument("--shuffle", action="store_true", help="the control: rewards permuted across clips")
    return parser.parse_args()


def colourless_captions(tiny: Path) -> Path:
    """The tiny set's metadata with the colour word removed from every caption (``metadata_nocolour.json``)."""
    from mm_data.synthetic import COLOURS

    rows = json.loads((tiny / "data" / "metadata.json").read_text())
    for row in rows:
        row["cap"] = [" ".join(w for w in c.split() if w.lower() not in COLOURS) for c in row["cap"]]
    path = tiny / "data" / "metadata_nocolour.json"
    path.write_text(json.dumps(rows, indent=1))
    return path


def shuffle_rewards() -> None:
    """The control: wrap the rollout scorer so that each call's rewards are permuted across its clips (keyed
    by the call's count, so the run is reproducible)."""
    from mm_trainer.modes import rollout_scoring

    original = rollout_scoring.RolloutScorer.__call__
    calls = [0]

    def permuted(self, latents, prompts, *, groups, names):  # type: ignore[no-untyped-def]
        rewards, logged = original(self, latents, prompts, groups=groups, names=names)
        calls[0] += 1
        order = torch.randperm(len(rewards), generator=torch.Generator().manual_seed(calls[0]))
        return rewards[order], logged

    rollout_scoring.RolloutScorer.__call__ = permuted  # type: ignore[method-assign]


def validation_override(every: int) -> str:
    """``training.validation``: every ``every`` steps, 4-step ODE samples of the held-out prompts x seeds."""
    prompts = [p for p in HELD_OUT for _ in SEEDS]
    seeds = [s for _ in HELD_OUT for s in SEEDS]
    return (
        f"training.validation={{interval: {every}, prompts: [{', '.join(prompts)}], seeds: {seeds}, num_frames: 9,"
        " height: 32, width: 32, fps: 8, sampling_steps: 4}"
    )


def run_on_tiny(
    config: str, tiny: Path, run: Path, *, steps: int, every: int, target: list[float], overrides: list[str]
) -> list[dict]:
    """One run of the shipped ``config`` at 1 rank on the tiny set, ``steps`` steps, scored by the
    ``colour_target`` reward toward ``target`` and validated every ``every`` steps
    (:func:`validation_override`), with further ``overrides``; its metrics records."""
    from wan22_train.cli import main as wan22_main
    from wan22_train.configs import config_path
    from wan22_train.tiny import tiny_overrides

    reward = "[{id: colour_target, options: {target: [" + ", ".join(str(v) for v in target) + "]}}]"
    common = [
        *tiny_overrides(tiny), f"training.save={run}", f"training.train_iters={steps}", f"training.save_interval={steps}",
        "training.tensorboard=false", "parallel.ulysses_parallel_size=1", f"training.rewards={reward}",
        validation_override(every),
    ]  # fmt: skip
    assert wan22_main(["--config", str(config_path(config)), *common, *overrides]) == 0
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def train(
    tiny: Path, metadata: Path, run: Path, *, args: argparse.Namespace, steps: int, every: int, lr: float
) -> list[dict]:
    """One run of ``tiny_grpo.yaml`` at 1 rank; its metrics records."""
    overrides = [
        f"data.data_path={metadata}", f"training.lr={lr}", f"model.pipeline.grpo.noise_level={args.noise_level}",
        f"model.pipeline.grpo.kl_weight={args.kl_weight}",
    ]  # fmt: skip
    return run_on_tiny(
        "tiny_grpo.yaml", tiny, run, steps=steps, every=every, target=args.target, overrides=overrides
    )


def start_and_run(
    train: Callable[..., list[dict]],
    out: Path,
    name: str,
    *,
    steps: int,
    every: int,
    lr: float | None,
    port: int,
) -> tuple[dict, list[dict], float]:
    """At 1 rank: the start (``train`` one step at learning rate 0: the policy as built, LoRA B = 0,
    validated) in ``out/start``, then ``steps`` steps in ``out/name``; the start's record, the run's
    records and its seconds."""
    os.environ.update(
        RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    first = train(out / "start", steps=1, every=1, lr=0.0)[0]
    start = time.time()
    records = train(out / name, steps=steps, every=every, lr=lr)
    return first, records, time.time() - start


def main() -> None:
    args = parse_args()
    from wan22_train.tiny import make_tiny

    tiny = make_tiny(args.out / "tiny", vae_fit_steps=args.vae_fit_steps)
    metadata = colourless_captions(tiny)
    if args.shuffle:  # the start trains at learning rate 0: shuffled or not, the same start
        shuffle_rewards()
    first, records, seconds = start_and_run(
        partial(train, tiny, metadata, args=args), args.out, "run_shuffled" if args.shuffle else "run",
        steps=args.steps, every=args.every, lr=args.lr, port=29731,
    )  # fmt: skip
    print(f"{seconds:.0f} s for {args.steps} steps{' (rewards shuffled)' if args.shuffle else ''}")
    print("step  val_reward  val_std  | train reward (mean since the last line)  grpo_kl")
    print(f"{0:4d}  {first['val_reward']:.5f}  {first['val_reward_colour_target_std']:.5f}  |")
    last = 0
    for r in records:
        if "val_reward" in r:
            window = [x["reward"] for x in records if last < x["step"] <= r["step"]]
            print(f"{r['step']:4d}  {r['val_reward']:.5f}  {r['val_reward_colour_target_std']:.5f}  | "
                  f"{sum(window) / len(window):.5f}  {r['grpo_kl']:.2e}")  # fmt: skip
            last = r["step"]


if __name__ == "__main__":
    main()
