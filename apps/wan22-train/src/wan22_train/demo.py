"""``wan22-train demo``: the README's main command, end to end on the tiny default.

make-tiny (if missing; the tiny VAE fitted to the clips) -> train on ``nproc`` CPU processes with
FSDP2 + Ulysses -> export the predictor to diffusers -> sample a clip for each training caption (at the
run's time shift; the first caption's is ``sample.mp4``) -> a contact sheet PNG: each caption's sampled
frames above its training clip's frames, and the loss plot (raw and smoothed over the step). Rerunning
resumes training from the last checkpoint.

Ctrl-C is a stop: the training saves the iteration it reached and the demo ends with one line saying
so (exit 130; ``mm_trainer.run.user_errors``); rerunning the same command resumes there. torchrun runs
under :data:`QUIET_TORCHRUN`, which forwards the Ctrl-C to the ranks and waits for them as torchrun does,
without the traceback torchrun prints when a signal ends it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mm_checkpoint import latest_iteration
from mm_config import TrainConfig
from mm_data import LossCurve, to_video_frames, write_contact_sheet
from mm_trainer import fit_summary

from wan22_train.configs import config_path
from wan22_train.pipeline import Wan22Pipeline
from wan22_train.tiny import (
    DEMO_SHAPES,
    VAE_FIT_STEPS,
    load_clips,
    make_tiny,
    tiny_overrides,
    whole_clip_patch,
)

#: Training steps of ``wan22-train demo``: enough for the tiny predictor to draw its clips.
DEMO_STEPS = 200
#: The demo's clips: smaller and shorter than the shipped tiny config's (:data:`wan22_train.tiny.CLIP`):
#: a 5x8x8 latent, which :data:`DEMO_TRANSFORMER` takes as one token.
DEMO_CLIP = {"num_frames": 5, "height": 16, "width": 16, "fps": 8}
#: The demo's predictor: the tiny one with a patch covering the whole 5x8x8 latent, so one token per
#: clip, 64 wide (4 heads x 16). Wan has no absolute position embedding (3D RoPE only): a multi-token
#: tiny predictor sampled from pure noise cannot tell its first frame from its last, and moves the
#: circle along the captioned axis in either direction (benchmarks/wan_demo_learning.py); one token
#: has nothing to tell apart.
DEMO_TRANSFORMER = {"patch_size": whole_clip_patch(DEMO_CLIP), "attention_head_dim": 16, "ffn_dim": 128}
#: The contact sheet's frames are drawn this many times larger than the 16x16 clips.
SHEET_SCALE = 6
#: Euler steps of the demo's sample.
SAMPLE_STEPS = 20
#: Weight on the past of the contact sheet's smoothed loss (TensorBoard's smoothing, as ``mm-train plot``).
SHEET_SMOOTHING = 0.9
#: Warmup of the demo's learning rate: this fraction of its steps (20 of the default 200), at least one
#: step, so that ``--steps`` of any length keeps the schedule's shape (``demo_warmup``).
DEMO_WARMUP_FRACTION = 0.1
#: The demo's training on top of the shipped tiny config (the user's overrides come after): a high
#: learning rate with warmup (:data:`DEMO_WARMUP_FRACTION` of the steps), every clip in each step,
#: captions padded to 8 tokens, not 16 (less padding around the words that tell the clips apart in the
#: cross-attention), no recompute.
DEMO_TRAINING = (
    "training.lr=5e-3",
    "training.lr_scheduler=cosine",
    "training.micro_batch_size=4",
    "model.models.text_encoder.config.text_len=8",
    "features.recompute_plan.apply_modules=[]",  # nothing to save at this size: recompute only costs
)


def make_demo_set(out: Path, vae_fit_steps: int = VAE_FIT_STEPS) -> Path:
    """The demo's tiny model set in ``out``: :data:`DEMO_SHAPES` clips of :data:`DEMO_CLIP`, the VAE fitted
    to them, the :data:`DEMO_TRANSFORMER` predictor."""
    return make_tiny(
        out, num_clips=len(DEMO_SHAPES), vae_fit_steps=vae_fit_steps, shapes=DEMO_SHAPES, clip=DEMO_CLIP,
        transformer=DEMO_TRANSFORMER,
    )  # fmt: skip


def demo_warmup(steps: int) -> int:
    """Warmup steps of a demo run of ``steps``: :data:`DEMO_WARMUP_FRACTION` of them, 1 to ``steps``."""
    return min(steps, max(1, round(DEMO_WARMUP_FRACTION * steps)))


def demo_overrides(out: Path, steps: int, nproc: int, extra: Sequence[str] = ()) -> list[str]:
    """Point the shipped tiny config at ``out``, then apply the user's ``extra`` overrides; resume when a
    checkpoint is there."""
    ckpt = out / "ckpt"
    overrides = [
        *tiny_overrides(out),
        f"training.save={ckpt}",
        f"training.train_iters={steps}",
        f"training.lr_warmup_iters={demo_warmup(steps)}",
        f"parallel.ulysses_parallel_size={min(nproc, 2)}",
        *(f"data.dataset.{k}={DEMO_CLIP[k]}" for k in ("num_frames", "height", "width")),
        *DEMO_TRAINING,
        *extra,
    ]
    if latest_iteration(ckpt) is not None:
        overrides.append(f"training.load={ckpt}")
    return overrides


QUIET_TORCHRUN = """
import logging, sys
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import main
for name in list(logging.root.manager.loggerDict):  # its "shutting down workers" warnings
    if name.startswith("torch.distributed.elastic"):
        logging.getLogger(name).setLevel(logging.ERROR)
try:
    main(sys.argv[1:])
except SignalException:  # Ctrl-C: the ranks got it, saved and exited; torchrun waited for them
    sys.exit(130)
"""
"""``torchrun ARGS`` as ``python -c QUIET_TORCHRUN ARGS``: the same launcher, ended by a signal
without a traceback (the demo reports the stop in one line)."""


def train_command(config: Path, overrides: list[str], nproc: int) -> list[str]:
    launcher = [sys.executable, "-c", QUIET_TORCHRUN, "--standalone", f"--nproc-per-node={nproc}"]
    return [
        *(launcher if nproc > 1 else [sys.executable]),
        "-m",
        "wan22_train",
        "--config",
        str(config),
        *overrides,
    ]


def wait_through_ctrl_c(proc: subprocess.Popen) -> tuple[int, bool]:
    """``(exit code, whether Ctrl-C came)`` of the training ``proc``. A Ctrl-C reaches the training too
    (the terminal signals its process group: this process and torchrun, which forwards it to the ranks);
    the ranks then save and exit, so this waits for them instead of ending at once."""
    interrupted = False
    while True:
        try:
            return proc.wait(), interrupted
        except KeyboardInterrupt:
            interrupted = True


def resume_hint(ckpt: Path) -> str:
    """What an interrupted demo says: where its training stopped, and that a rerun resumes there."""
    saved = latest_iteration(ckpt)
    if saved is None:
        return "no checkpoint saved yet: the same command starts the training again"
    return f"training stopped at its checkpoint of iteration {saved} ({ckpt}); the same command resumes it"


def training_shift(config: TrainConfig) -> float:
    """The flow-match time shift the run trained at (``model.pipeline.shift``, or the scheduler's
    default): what its samples should be drawn at. A distilled student (``model.pipeline.distill``) was
    trained on Euler steps at ``distill.student_shift`` (default: the same shift)."""
    options = dict(config.model.pipeline or {})
    student_shift = (options.pop("distill", None) or {}).get("student_shift")
    return float(student_shift or Wan22Pipeline.from_options(options).scheduler.shift)


def logged_losses(ckpt: Path) -> LossCurve:
    """The loss of every logged step of the run in ``ckpt`` (its ``metrics.jsonl``), raw and smoothed
    (:data:`SHEET_SMOOTHING`)."""
    rows = [json.loads(line) for line in (ckpt / "metrics.jsonl").read_text().splitlines()]
    steps, raw = zip(*((row["step"], row["loss"]) for row in rows if "loss" in row), strict=True)
    return LossCurve.smoothed_by(steps, raw, SHEET_SMOOTHING)


def sheet_rows(
    captions: Sequence[str], samples: Sequence[Any], clips: Sequence[Any]
) -> list[tuple[str, Any]]:
    """The contact sheet's rows: for each caption, its sampled frames above its training clip's frames."""
    rows = []
    for caption, sample, clip in zip(captions, samples, clips, strict=True):
        rows += [
            (f"sample: {caption}", to_video_frames(sample)),
            (f"training clip: {caption}", to_video_frames(clip)),
        ]
    return rows


def run_demo(
    out: Path,
    *,
    nproc: int = 2,
    steps: int = DEMO_STEPS,
    overrides: Sequence[str] = (),
    vae_fit_steps: int = VAE_FIT_STEPS,
) -> int:
    """Run the whole chain; print where each artifact is. ``overrides`` (dotted, e.g.
    ``training.save_interval=5``) apply to the training run. Returns a process exit code."""
    from wan22_train.export import export_predictor
    from wan22_train.sampling import load_for_sampling, sample_video, write_video

    out = out.resolve()
    print(
        f"[1/5] tiny model set + clips: {make_demo_set(out, vae_fit_steps)}",
        flush=True,
    )
    print(f"      {fit_summary(out / 'vae')}", flush=True)
    config = config_path("tiny_t2v.yaml")
    overrides = demo_overrides(out, steps, nproc, overrides)
    print(f"[2/5] training {steps} steps on {nproc} CPU process(es): FSDP2 + Ulysses", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    ckpt = out / "ckpt"
    training = subprocess.Popen(train_command(config, overrides, nproc), env=env)
    returncode, interrupted = wait_through_ctrl_c(training)
    if interrupted:
        raise KeyboardInterrupt(resume_hint(ckpt))  # run() prints it as one line, exit 130
    if returncode != 0:
        print(f"training failed (exit {returncode})", file=sys.stderr)
        return returncode
    from mm_trainer import load_run_config

    cfg = load_run_config(ckpt)
    exported = export_predictor(cfg, ckpt, out / "export" / "transformer")
    print(f"[3/5] exported predictor (diffusers WanTransformer3DModel): {exported}", flush=True)
    metadata = out / "data" / "metadata.json"
    captions = [row["cap"][0] for row in json.loads(metadata.read_text())]
    size = {k: DEMO_CLIP[k] for k in ("num_frames", "height", "width")}
    modules = load_for_sampling(cfg, ckpt)
    videos = [
        sample_video(modules, caption, **size, steps=SAMPLE_STEPS, shift=training_shift(cfg))
        for caption in captions
    ]
    clip = write_video(videos[0], out / "sample.mp4", fps=DEMO_CLIP["fps"])
    print(f"[4/5] sampled the {len(captions)} training captions; {captions[0]!r}: {clip}", flush=True)
    losses = logged_losses(ckpt)
    rows = sheet_rows(captions, videos, load_clips(metadata, DEMO_CLIP))
    sheet = write_contact_sheet(out / "contact_sheet.png", rows, losses, scale=SHEET_SCALE)
    print(
        f"[5/5] contact sheet (each caption's sampled frames above its training clip's, loss plot): {sheet}",
        flush=True,
    )
    raw = losses.raw
    print(f"loss: first {raw[0]:.4f} -> last {raw[-1]:.4f} over {len(raw)} logged steps")
    print(f"checkpoints: {ckpt}  metrics: {ckpt / 'metrics.jsonl'}  config: {ckpt / 'config.yaml'}")
    return 0
