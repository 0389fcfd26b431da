"""The README's main command end to end: make-tiny (the VAE fitted to the clips), train on 2 gloo
ranks (FSDP2 + Ulysses 2), export, sample, contact sheet; and what the sample shows.

One demo chain (the README's ``wan22-train demo``, killed after its first checkpoint, rerun to the end)
is shared by the tests below; the README's ``wan22-train demo --steps 8 training.save_interval=4`` runs
on a copy of its fitted model set. Both command lines are taken from the README by their text, with
``--out`` (and the chain's checkpoint interval) added.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import av
import numpy as np
import pytest
import torch
from mm_data import contact_sheet_size, loss_plot_area, moves_as_captioned, psnr, to_video_frames
from mm_data.contact_sheet import LABEL_HEIGHT, PAD, RAW, SMOOTHED
from mm_trainer import load_run_config
from mm_trainer.cli import main as mm_train_main
from mm_trainer.run.exit_codes import EXIT_INTERRUPTED
from PIL import Image
from wan22_train.demo import (
    DEMO_CLIP,
    DEMO_STEPS,
    DEMO_TRANSFORMER,
    SAMPLE_STEPS,
    SHEET_SCALE,
    make_demo_set,
    training_shift,
)
from wan22_train.tiny import DEMO_SHAPES, load_clips

pytestmark = pytest.mark.slow
SIZE = {k: DEMO_CLIP[k] for k in ("num_frames", "height", "width")}
INTERVAL = 10  # checkpoint interval of the chain (the shipped config: every 25)
WAN_README = "apps/wan22-train/README.md"
DEMO = "wan22-train demo"
SHORT_DEMO = "wan22-train demo --steps 8 training.save_interval=4"


def demo_command(readme, line: str, out, *extra: str) -> list[str]:
    """The README's demo ``line`` as a ``python -m wan22_train`` command writing into ``out``."""
    argv = readme.command(WAN_README, line, extra=("--out", str(out), *extra))
    return [sys.executable, "-m", "wan22_train", *argv[1:]]


def run_demo(cmd: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def start_demo_and_kill_it_after_its_checkpoint(cmd: list[str], out, interval: int, kill_job) -> int:
    """Start the demo ``cmd``, SIGKILL it (its launcher, torchrun and both ranks: ``kill_job``) once its
    checkpoint at ``interval`` is recorded; return how many metrics lines it had written."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tracker = out / "ckpt" / "latest_checkpointed_iteration.txt"
    try:
        deadline = time.monotonic() + 300
        while not (tracker.exists() and tracker.read_text().strip() == str(interval)):
            assert proc.poll() is None, f"the demo ended before its checkpoint at step {interval} was seen"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert proc.poll() is None, "too late: the demo finished before it could be killed"
    finally:
        kill_job(proc)
    return len((out / "ckpt" / "metrics.jsonl").read_text().splitlines())


@pytest.fixture(scope="module")
def killed(tmp_path_factory, readme, kill_job):
    """The README's ``wan22-train demo`` (fitted VAE, ``DEMO_STEPS`` steps, a checkpoint every ``INTERVAL``),
    killed after its first checkpoint: (folder, command, records it had written). A fixture of its own so
    that the two demo runs are set up by two tests (each under the 120 s a test phase may take)."""
    out = tmp_path_factory.mktemp("wan_demo") / "tiny"
    cmd = demo_command(readme, DEMO, out, f"training.save_interval={INTERVAL}")
    return out, cmd, start_demo_and_kill_it_after_its_checkpoint(cmd, out, INTERVAL, kill_job)


@pytest.fixture(scope="module")
def chain(killed):
    """:func:`killed`'s demo rerun to the end: (folder, rerun's stdout, killed_at, rerun's stderr)."""
    out, cmd, killed_at = killed
    rerun = run_demo(cmd)
    return out, rerun.stdout, killed_at, rerun.stderr


def test_a_demo_killed_after_its_checkpoint_leaves_the_checkpoint_and_its_records(killed):
    """SIGKILL saves nothing: the checkpoint of step ``INTERVAL`` is the last, and the records up to it stay."""
    out, _, killed_at = killed
    assert (out / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == str(INTERVAL)
    assert killed_at >= INTERVAL
    assert not (out / "export").exists()  # the demo exports only after its last step


@pytest.fixture(scope="module")
def sampling(chain):
    """The demo run's modules for sampling (VAE, text encoder, trained predictor)."""
    from mm_config import load_config
    from wan22_train.sampling import load_for_sampling

    out = chain[0]
    return load_for_sampling(load_config(out / "ckpt" / "config.yaml", world_size=2), out / "ckpt")


def draw_samples(chain, sampling) -> dict[str, torch.Tensor]:
    """Each training caption's sample, drawn as the demo draws it (its steps, at the run's shift), in
    the metadata's order. Drawn in each test that needs them: ``euler_step`` changes the sampler."""
    from wan22_train.sampling import sample_video

    out = chain[0]
    captions = [row["cap"][0] for row in json.loads((out / "data" / "metadata.json").read_text())]
    shift = training_shift(load_run_config(out / "ckpt"))
    return {c: sample_video(sampling, c, **SIZE, steps=SAMPLE_STEPS, shift=shift) for c in captions}


def test_a_demo_killed_mid_run_resumes_when_rerun_then_trains_exports_and_samples(chain, sampling):
    # One chain for both behaviours (each demo run starts torchrun and two ranks): killed after the
    # checkpoint at step 10, rerun to the end.
    out, printed, killed_at, log = chain
    steps, interval = DEMO_STEPS, INTERVAL
    assert interval <= killed_at < steps
    for artifact in ("ckpt", "export/transformer", "sample.mp4"):
        assert str(out / artifact) in printed
    resumed = re.search(r"resumed from \S+ at iteration (\d+)", log)
    assert resumed and int(resumed.group(1)) == interval, log[-3000:]  # its checkpoint: SIGKILL saves nothing
    # The killed run's records up to its checkpoint stay; those it wrote past it (the kill may land after
    # the next step was logged) are dropped on resume, and the rerun writes the rest.
    lines = [json.loads(line) for line in (out / "ckpt" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(1, steps + 1))
    losses = [r["loss"] for r in lines]
    assert len(losses) == steps and all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[:10]) / 10 > sum(losses[-10:]) / 10

    # `mm-train plot` draws the run: one 240-pixel panel per series (+ validation loss if logged)
    assert mm_train_main(["plot", str(out / "ckpt"), "--out", str(out / "curves.png")]) == 0
    with Image.open(out / "curves.png") as image:
        panels = 3 + any("val_loss" in r for r in lines)
        assert image.format == "PNG" and image.size == (900, 240 * panels + 60)

    with av.open(str(out / "sample.mp4")) as clip:
        frames = [f.to_ndarray(format="rgb24") for f in clip.decode(video=0)]
    assert len(frames) == SIZE["num_frames"] and frames[0].shape == (SIZE["height"], SIZE["width"], 3)

    # The exported folder is the trained predictor: diffusers loads it and computes the same output.
    from diffusers import WanTransformer3DModel

    trained = sampling["predictor"]
    exported = WanTransformer3DModel.from_pretrained(out / "export" / "transformer").eval()
    g = torch.Generator().manual_seed(0)
    x, t, text = (
        torch.randn(1, exported.config.in_channels, *DEMO_TRANSFORMER["patch_size"], generator=g),
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


def test_make_tiny_reports_a_vae_that_reconstructs_the_clips_and_reuses_it(chain):
    out, printed, *_ = chain
    report = json.loads((out / "vae" / "fit.json").read_text())
    assert f"reconstruction PSNR on the {len(DEMO_SHAPES)} clips: {report['psnr_db']:.2f} dB" in printed
    assert report["psnr_db"] >= 25.0
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan.from_pretrained(out / "vae").eval()
    clips = load_clips(out / "data" / "metadata.json", DEMO_CLIP)
    with torch.no_grad():
        reconstruction = vae.decode(vae.encode(clips).latent_dist.mode()).sample.clamp(-1, 1)
    assert psnr(reconstruction, clips) == pytest.approx(report["psnr_db"], abs=0.01)

    weights = out / "vae" / "diffusion_pytorch_model.safetensors"
    written = weights.stat().st_mtime_ns
    make_demo_set(out, report["fit_steps"])  # cached
    assert weights.stat().st_mtime_ns == written


def _tiles(sheet: np.ndarray, row: int) -> np.ndarray:
    """The frames of the sheet's ``row``, at the sheet's scale: [T, H * scale, W * scale, 3]."""
    h, w = SIZE["height"] * SHEET_SCALE, SIZE["width"] * SHEET_SCALE
    top = PAD + row * (LABEL_HEIGHT + h + PAD) + LABEL_HEIGHT
    return np.stack([sheet[top : top + h, PAD + k * (w + PAD) :][:, :w] for k in range(SIZE["num_frames"])])


def _scaled(frames: np.ndarray) -> np.ndarray:
    return frames.repeat(SHEET_SCALE, axis=1).repeat(SHEET_SCALE, axis=2)  # the sheet's nearest-neighbour


def test_demo_writes_a_contact_sheet_of_each_captions_sample_above_its_clip_and_the_loss_plot(
    chain, sampling
):
    out, printed, *_ = chain
    samples = draw_samples(chain, sampling)
    sheet_path = out / "contact_sheet.png"
    said = "contact sheet (each caption's sampled frames above its training clip's, loss plot)"
    assert f"{said}: {sheet_path}" in printed
    with Image.open(sheet_path) as image:
        assert image.format == "PNG"
        assert image.size == contact_sheet_size(*SIZE.values(), 2 * len(DEMO_SHAPES), scale=SHEET_SCALE)
        sheet = np.asarray(image.convert("RGB"))
    clips = load_clips(out / "data" / "metadata.json", DEMO_CLIP)
    assert len(samples) == len(clips) == len(DEMO_SHAPES)  # all four captions, in the metadata's order
    for i, (sample, clip) in enumerate(zip(samples.values(), clips)):
        assert np.array_equal(_tiles(sheet, 2 * i), _scaled(to_video_frames(sample))), f"sample row {i}"
        assert np.array_equal(_tiles(sheet, 2 * i + 1), _scaled(to_video_frames(clip))), f"clip row {i}"
    # the loss plot: the raw curve and the smoothed one inside the axes, over all the run's steps
    left, top, right, bottom = loss_plot_area(image.size)
    plot = sheet[top:bottom, left + 1 : right]
    for colour in (RAW, SMOOTHED):
        columns = np.nonzero((plot == colour).all(-1))[1]
        assert columns.size and np.ptp(columns) > 0.95 * (right - left - 1), colour


def test_the_sample_for_every_training_caption_moves_as_captioned_and_matches_its_clip(
    chain, sampling, euler_step
):
    # Each of the four captions names one clip (its colour and direction). The sample drawn the way the
    # demo draws it must move its shape in the captioned direction in every frame pair, and be within
    # 18 dB PSNR of the VAE's reconstruction of the clip. With the Euler step inverted it must not.
    out = chain[0]
    samples = draw_samples(chain, sampling)
    vae, clips = sampling["ae"], load_clips(out / "data" / "metadata.json", DEMO_CLIP)
    assert len(samples) == len(DEMO_SHAPES) == len(clips)
    for (caption, video), clip in zip(samples.items(), clips):
        reconstruction = vae.decode(vae.encode(clip[None]))[0]
        assert moves_as_captioned(to_video_frames(video), caption), caption
        assert psnr(video, reconstruction) >= 18.0, caption


def test_samples_are_deterministic_for_a_seed(sampling):
    from wan22_train.sampling import sample_video

    first, again, other = (
        sample_video(sampling, "a red square moving left", **SIZE, steps=4, shift=3.0, seed=seed)
        for seed in (3, 3, 4)
    )
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_the_readmes_short_demo_runs_its_8_steps_with_a_warmup_that_fits(chain, tmp_path, readme):
    # `wan22-train demo --steps 8 training.save_interval=4` on a copy of the chain's fitted model set (the
    # VAE fit is reused: fit.json matches), so only its training, export and sample run here.
    out = tmp_path / "short"
    shutil.copytree(chain[0], out, ignore=shutil.ignore_patterns("ckpt", "export", "sample.mp4", "*.png"))
    printed = run_demo(demo_command(readme, SHORT_DEMO, out)).stdout
    rows = [json.loads(line) for line in (out / "ckpt" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert (out / "ckpt" / "iter_0000004").is_dir() and (out / "ckpt" / "iter_0000008").is_dir()
    lrs = [r["lr"] for r in rows]  # warmup: 10% of 8 steps (1 step), then the cosine decay from 5e-3
    assert max(lrs) <= 5e-3 * (1 + 1e-6) and lrs[-1] < max(lrs)
    assert str(out / "sample.mp4") in printed and (out / "export" / "transformer" / "config.json").is_file()


def test_ctrl_c_during_the_demos_training_saves_ends_in_one_line_and_leaves_a_run_to_resume(
    chain, tmp_path, readme, kill_job
):
    # `wan22-train demo` on a copy of the chain's fitted model set, started as a terminal starts a job (a
    # process group of its own), then Ctrl-C as a terminal sends it: SIGINT to that group (the demo and
    # torchrun; the ranks get it from torchrun) once the first step is logged.
    from mm_checkpoint import latest_iteration
    from wan22_train.demo import demo_overrides

    out = tmp_path / "interrupted"
    shutil.copytree(chain[0], out, ignore=shutil.ignore_patterns("ckpt", "export", "sample.mp4", "*.png"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = demo_command(readme, DEMO, out, "training.save_interval=1000")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    metrics = out / "ckpt" / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 300
        while not (metrics.exists() and metrics.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, "the demo ended before its first step"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        printed, err = proc.communicate(timeout=120)
    finally:
        kill_job(proc)
    saved = latest_iteration(out / "ckpt")
    assert proc.returncode == EXIT_INTERRUPTED, err[-3000:]
    assert "Traceback" not in err and "SignalException" not in err, err[-3000:]
    assert err.splitlines()[-1] == (
        f"wan22-train: interrupted: training stopped at its checkpoint of iteration {saved} ({out / 'ckpt'}); "
        "the same command resumes it"
    ), err[-3000:]
    assert err.count("wan22-train: interrupted") == 1 and saved >= 1  # the stop saved where it was
    assert f"wan22-train: last checkpoint: {out / 'ckpt' / f'iter_{saved:07d}'}" in printed.splitlines()
    assert not (out / "ckpt" / ".mm_train.lock").exists()  # released: a rerun is not refused
    assert f"training.load={out / 'ckpt'}" in demo_overrides(out, DEMO_STEPS, 2)  # and resumes it
