"""``wan22-train demo``: the README's main command, end to end on the tiny default.

make-tiny (if missing) -> train on ``nproc`` CPU processes with FSDP2 + Ulysses -> export the
predictor to diffusers -> sample a clip. Rerunning resumes training from the last checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from mm_checkpoint import latest_iteration

from wan22_train.configs import config_path
from wan22_train.tiny import make_tiny, tiny_overrides


def demo_overrides(out: Path, steps: int, nproc: int, extra: Sequence[str] = ()) -> list[str]:
    """Point the shipped tiny config at ``out``, then apply the user's ``extra`` overrides; resume when a
    checkpoint is there."""
    ckpt = out / "ckpt"
    overrides = [
        *tiny_overrides(out),
        f"training.save={ckpt}",
        f"training.train_iters={steps}",
        f"parallel.ulysses_parallel_size={min(nproc, 2)}",
        *extra,
    ]
    if latest_iteration(ckpt) is not None:
        overrides.append(f"training.load={ckpt}")
    return overrides


def train_command(config: Path, overrides: list[str], nproc: int) -> list[str]:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return [
        *(launcher if nproc > 1 else [sys.executable]),
        "-m",
        "wan22_train",
        "--config",
        str(config),
        *overrides,
    ]


def run_demo(out: Path, *, nproc: int = 2, steps: int = 50, overrides: Sequence[str] = ()) -> int:
    """Run the whole chain; print where each artifact is. ``overrides`` (dotted, e.g.
    ``training.save_interval=5``) apply to the training run. Returns a process exit code."""
    from wan22_train.export import export_predictor
    from wan22_train.sampling import load_for_sampling, sample_video, write_video

    out = out.resolve()
    print(f"[1/4] tiny model set + clips: {make_tiny(out)}", flush=True)
    config = config_path("tiny_t2v.yaml")
    overrides = demo_overrides(out, steps, nproc, overrides)
    print(f"[2/4] training {steps} steps on {nproc} CPU process(es): FSDP2 + Ulysses", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    result = subprocess.run(train_command(config, overrides, nproc), env=env)
    if result.returncode != 0:
        print(f"training failed (exit {result.returncode})", file=sys.stderr)
        return result.returncode
    ckpt = out / "ckpt"
    from mm_trainer import load_run_config

    cfg = load_run_config(ckpt)
    exported = export_predictor(cfg, ckpt, out / "export" / "transformer")
    print(f"[3/4] exported predictor (diffusers WanTransformer3DModel): {exported}", flush=True)
    prompt = json.loads((out / "data" / "metadata.json").read_text())[0]["cap"][0]
    video = sample_video(load_for_sampling(cfg, ckpt), prompt, num_frames=9, height=32, width=32, steps=10)
    clip = write_video(video, out / "sample.mp4", fps=8)
    print(f"[4/4] sampled {prompt!r}: {clip}", flush=True)
    losses = [json.loads(line)["loss"] for line in (ckpt / "metrics.jsonl").read_text().splitlines()]
    print(f"loss: first {losses[0]:.4f} -> last {losses[-1]:.4f} over {len(losses)} logged steps")
    print(f"checkpoints: {ckpt}  metrics: {ckpt / 'metrics.jsonl'}  config: {ckpt / 'config.yaml'}")
    return 0
