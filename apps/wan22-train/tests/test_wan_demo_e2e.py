"""The README's main command end to end: make-tiny, train on 2 gloo ranks (FSDP2 + Ulysses 2), export, sample."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import av
import pytest
import torch
from mm_trainer.cli import main as mm_train_main
from PIL import Image

pytestmark = pytest.mark.slow


def demo_command(out, steps: int, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "wan22_train", "demo", "--out", str(out), "--steps", str(steps), *overrides]


def run_demo(out, steps: int, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = demo_command(out, steps, *overrides)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def start_demo_and_kill_it_after_its_checkpoint(out, steps: int, interval: int) -> int:
    """Start the demo, SIGKILL it (launcher and both ranks) once its checkpoint at ``interval`` is
    recorded; return how many metrics lines it had written."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        demo_command(out, steps, f"training.save_interval={interval}"), env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    tracker = out / "ckpt" / "latest_checkpointed_iteration.txt"
    try:
        deadline = time.monotonic() + 300
        while not (tracker.exists() and tracker.read_text().strip() == str(interval)):
            assert proc.poll() is None, f"the demo ended before its checkpoint at step {interval} was seen"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert proc.poll() is None, "too late: the demo finished before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return len((out / "ckpt" / "metrics.jsonl").read_text().splitlines())


def test_a_demo_killed_mid_run_resumes_when_rerun_then_trains_exports_and_samples(tmp_path):
    # One chain for both behaviours (each demo run starts torchrun and two ranks): 30 steps with a
    # checkpoint every 10 (the shipped config: every 25 of 50), killed after step 10, rerun to the end.
    out = tmp_path / "tiny"
    steps, interval = 30, 10
    killed_at = start_demo_and_kill_it_after_its_checkpoint(out, steps, interval)
    assert interval <= killed_at < steps

    printed = run_demo(out, steps, f"training.save_interval={interval}").stdout
    for artifact in ("ckpt", "export/transformer", "sample.mp4"):
        assert str(out / artifact) in printed
    lines = [json.loads(line) for line in (out / "ckpt" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines[killed_at:]] == list(range(interval + 1, steps + 1))  # resumed at 11

    run = lines[:interval] + lines[killed_at:]  # steps 1-10 of the killed run, then 11-30
    assert [r["step"] for r in run] == list(range(1, steps + 1))
    losses = [r["loss"] for r in run]
    assert len(losses) == 30 and all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[:10]) / 10 > sum(losses[-10:]) / 10

    # `mm-train plot` draws the run: one 240-pixel panel per series (+ validation loss if logged)
    assert mm_train_main(["plot", str(out / "ckpt"), "--out", str(out / "curves.png")]) == 0
    with Image.open(out / "curves.png") as image:
        panels = 3 + any("val_loss" in r for r in lines)
        assert image.format == "PNG" and image.size == (900, 240 * panels + 60)

    with av.open(str(out / "sample.mp4")) as clip:
        frames = [f.to_ndarray(format="rgb24") for f in clip.decode(video=0)]
    assert len(frames) == 9 and frames[0].shape == (32, 32, 3)

    # The exported folder is the trained predictor: diffusers loads it and computes the same output.
    from diffusers import WanTransformer3DModel
    from mm_config import load_config
    from wan22_train.sampling import load_for_sampling

    trained = load_for_sampling(load_config(out / "ckpt" / "config.yaml", world_size=2), out / "ckpt")[
        "predictor"
    ]
    exported = WanTransformer3DModel.from_pretrained(out / "export" / "transformer").eval()
    g = torch.Generator().manual_seed(0)
    x, t, text = (
        torch.randn(1, 4, 3, 8, 8, generator=g),
        torch.tensor([600.0]),
        torch.randn(1, 5, 32, generator=g),
    )
    with torch.no_grad():
        torch.testing.assert_close(
            exported(x, t, text, return_dict=False)[0], trained(x, t, text), rtol=1e-5, atol=1e-5
        )
    source = WanTransformer3DModel.from_pretrained(out / "transformer").eval()
    with torch.no_grad():
        assert not torch.allclose(
            source(x, t, text, return_dict=False)[0], trained(x, t, text)
        )  # it did train
