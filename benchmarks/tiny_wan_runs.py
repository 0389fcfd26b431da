"""The tiny Wan2.2 learning runs the reward fine-tuning benchmarks share (``wan_dpo_learning.py``): one shipped
config at 1 rank on ``make-tiny``'s set, scored by the ``colour_target`` reward and validated on held-out
colourless prompts x seeds, after a start at learning rate 0 (the policy as built). Not a benchmark itself.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

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
