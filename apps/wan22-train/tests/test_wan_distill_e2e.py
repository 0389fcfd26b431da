"""Few-step distillation (``tiny_t2v_distill.yaml``: DMD2 phases ``critic`` / ``generator``) through the
trainer: a run at 2 ranks with Ulysses 2, killed with SIGKILL, resumes at 1 rank without Ulysses and
trains every phase's losses of an uninterrupted run; the student then exports as a plain predictor and
samples on its 4-step schedule. With ``training.ema`` the export of the average (``export --ema``) is the
student's EMA over every step of the phased loop.

The uninterrupted reference is ``wan22-train``'s ``main`` on forked gloo ranks; the run to kill is a real
torchrun job (SIGKILL needs a process of its own), and its resume a real single process."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from diffusers import WanTransformer3DModel
from mm_trainer import load_run_config
from wan22_train.cli import main as wan22_main
from wan22_train.configs import config_path
from wan22_train.export import export_predictor
from wan22_train.key_maps import diffusers_to_native
from wan22_train.tiny import make_tiny, tiny_overrides

pytestmark = pytest.mark.slow

STEPS, SAVE_EVERY = 8, 3
PHASE_LOSSES = ("loss_critic", "loss_generator")


def overrides(tiny: Path, save: Path) -> list[str]:
    models = [f"model.models.{name}.from_pretrained={tiny / 'transformer'}" for name in ("teacher", "critic")]
    return [
        *tiny_overrides(tiny), *models, f"training.save={save}", f"training.train_iters={STEPS}",
        f"training.save_interval={SAVE_EVERY}", "training.log_interval=1", "training.tensorboard=false",
    ]  # fmt: skip


def records(save: Path) -> list[dict]:
    return [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]


def command(tiny: Path, save: Path, nproc: int, *extra: str) -> list[str]:
    args = ["--config", str(config_path("tiny_t2v_distill.yaml")), *overrides(tiny, save), *extra]
    if nproc == 1:
        return [sys.executable, "-m", "wan22_train", *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "wan22_train", *args]  # fmt: skip


def native_weights(folder: Path) -> dict[str, torch.Tensor]:
    """An exported (diffusers-layout) predictor's weights under the native keys."""
    return diffusers_to_native(WanTransformer3DModel.from_pretrained(folder).state_dict())


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def kill_after(proc: subprocess.Popen, log: Path, lines: int, kill_job) -> None:
    """SIGKILL the job (torchrun and its ranks: ``kill_job``) once ``log`` has ``lines`` records (before it
    ends)."""
    deadline = time.monotonic() + 300
    while not (log.exists() and len(log.read_text().splitlines()) >= lines):
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, f"the run never reached step {lines}"
        time.sleep(0.02)
    kill_job(proc)


def test_distillation_killed_at_2_ranks_ulysses_2_resumes_at_1_rank_with_the_uninterrupted_losses(
    tmp_path, main_forked, kill_job
):
    tiny = make_tiny(tmp_path / "tiny")
    reference = tmp_path / "reference"
    main_forked(wan22_main, command(tiny, reference, 1)[3:], 2, timeout=600)
    expected = records(reference)
    assert [r["step"] for r in expected] == list(range(1, STEPS + 1))
    assert [r["step"] for r in expected if "loss_generator" in r] == [1, 6]  # every 5th step (0-based 0, 5)

    crashed = tmp_path / "crashed"
    proc = subprocess.Popen(
        command(tiny, crashed, 2), env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        kill_after(proc, crashed / "metrics.jsonl", 5, kill_job)
    finally:
        kill_job(proc)
    assert len(records(crashed)) < STEPS

    validation = ("training.validation={interval: 8, prompts: [a red ball], seeds: [5], num_frames: 9, height: 32, "
                  "width: 32, fps: 8}")  # fmt: skip
    resumed = subprocess.run(
        command(tiny, crashed, 1, "parallel.ulysses_parallel_size=1", validation), env=env(), capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    at = int(re.search(r"resumed from \S+ at iteration (\d+)", resumed.stderr).group(1))
    assert at == 3, (
        f"resumed at {at}: expected the last complete checkpoint (3; SIGKILL after step 5 saves nothing)"
    )
    got = records(crashed)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    # Validation samples the student on its 4 steps and measures it against the teacher's 50-step clip.
    assert math.isfinite(got[-1]["val_psnr_to_reference"]) and "val_psnr_to_reference" not in got[-2]
    assert (crashed / "validation" / "iter_0000008" / "0.mp4").is_file()
    for key in PHASE_LOSSES:
        want = torch.tensor([r.get(key, float("nan")) for r in expected])
        have = torch.tensor([r.get(key, float("nan")) for r in got])
        torch.testing.assert_close(have, want, rtol=1e-4, atol=0, equal_nan=True)

    # The student exports as a plain predictor and samples alone on its 4-step schedule: the sigmas it
    # trained on (`wan22-train sample --steps 4`).
    from wan22_train.container import Wan22Container
    from wan22_train.demo import training_shift
    from wan22_train.sampling import load_for_sampling, sample_video, student_sigmas

    config = load_run_config(crashed)
    modules = load_for_sampling(config, crashed)
    assert not {"teacher", "critic"} & set(modules)
    timesteps = []
    modules["predictor"].register_forward_hook(lambda _, args, __: timesteps.append(float(args[1])))
    video = sample_video(
        modules, "a red ball", num_frames=9, height=32, width=32, steps=4, shift=training_shift(config),
        sigmas=student_sigmas(config, 4),
    )  # fmt: skip
    trained = Wan22Container.build_pipeline(config.model.pipeline).student_sigmas()
    assert video.shape == (3, 9, 32, 32) and timesteps == (trained[:-1] * 1000).tolist()
    weights = native_weights(export_predictor(config, crashed, tmp_path / "student"))
    student = modules["predictor"].state_dict()
    torch.testing.assert_close(weights["blocks.0.self_attn.q.weight"], student["blocks.0.self_attn.q.weight"])


def test_a_distillation_exports_the_ema_of_its_student(tmp_path):
    """The trainer updates ``training.ema`` after every step of the phased loop, the generator phase every
    5th step: after 5 steps with one generator update ``w1`` from the teacher's weights ``w0`` the
    student's average is ``w1 + decay**5 * (w0 - w1)``."""
    decay, steps = 0.5, 5
    tiny, save = make_tiny(tmp_path / "tiny"), tmp_path / "run"
    run = subprocess.run(
        command(tiny, save, 1, "parallel.ulysses_parallel_size=1", f"training.train_iters={steps}",
                f"training.save_interval={steps}", f"training.ema={{decay: {decay}}}"),
        env=env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    config = load_run_config(save)
    last = native_weights(export_predictor(config, save, tmp_path / "last"))
    average = native_weights(export_predictor(config, save, tmp_path / "ema", ema=True))
    start = native_weights(tiny / "transformer")
    assert any(not torch.equal(last[key], start[key]) for key in last), "the generator step changed no weight"
    step = torch.cat([(start[key] - last[key]).double().flatten() for key in last])
    lead = torch.cat([(average[key] - last[key]).double().flatten() for key in last])
    # the average's lead over the last weights, as a multiple of the generator's step: decay**5, elementwise
    assert (lead @ step / (step @ step)).item() == pytest.approx(decay**steps, rel=1e-3)
    torch.testing.assert_close(lead, decay**steps * step, rtol=0, atol=1e-3 * step.abs().max().item())


BOTH_STEPS = 2
GENERATOR_EVERY_STEP = (
    "training.phases.generator.every=1"  # a generator step after the resume too, in 2 steps
)


def both_experts_args(tiny: Path, save: Path, *extra: str) -> list[str]:
    """``tiny_t2v_both_distill.yaml`` on the tiny model set: every transformer sub-model from its predictor."""
    subs = ("teacher", "critic", "teacher_low", "predictor_low", "critic_low")
    return [
        "--config", str(config_path("tiny_t2v_both_distill.yaml")), *tiny_overrides(tiny),
        *[f"model.models.{name}.from_pretrained={tiny / 'transformer'}" for name in subs],
        f"training.save={save}", f"training.train_iters={BOTH_STEPS}", "training.save_interval=1",
        "training.log_interval=1", "training.tensorboard=false", *extra,
    ]  # fmt: skip


def cut_back_to(run: Path, iteration: int) -> None:
    """``run`` as a run stopped after ``iteration`` (its later checkpoints and records gone)."""
    for folder in run.glob("iter_*"):
        if int(folder.name[5:]) > iteration:
            shutil.rmtree(folder)
    (run / "latest_checkpointed_iteration.txt").write_text(f"{iteration}\n")
    lines = (run / "metrics.jsonl").read_text().splitlines()[:iteration]
    (run / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))


def test_a_two_expert_distillation_saved_before_both_students_stepped_resumes_at_any_layout(
    tmp_path, main_forked
):
    """Iteration 1 of ``tiny_t2v_both_distill.yaml`` at 2 ranks: one generator step, which trained the
    student of one expert only (the other's optimizer state does not exist yet). It resumes at 2 ranks
    with Ulysses 2 and at 1 rank without, and trains the uninterrupted run's losses of the next step,
    a generator step (every step here, to keep the test short)."""
    from mm_checkpoint.restricted_dcp import read_dcp_metadata

    tiny = make_tiny(tmp_path / "tiny")
    reference = tmp_path / "reference"
    main_forked(wan22_main, both_experts_args(tiny, reference, GENERATOR_EVERY_STEP), 2, timeout=600)
    expected = records(reference)
    assert [r["step"] for r in expected if "loss_generator" in r] == [1, 2]
    stored = read_dcp_metadata(reference / "iter_0000001").state_dict_metadata
    stepped = [
        s
        for s in ("predictor", "predictor_low")
        if any(k.startswith(f"optimizer.state.{s}.") for k in stored)
    ]
    assert len(stepped) == 1, f"iteration 1 holds optimizer state of the students {stepped}: expected one"

    for nproc in (2, 1):
        run = tmp_path / f"resumed_at_{nproc}"
        shutil.copytree(reference, run)
        cut_back_to(run, 1)
        layout = f"parallel.ulysses_parallel_size={nproc}"
        main_forked(wan22_main, both_experts_args(tiny, run, GENERATOR_EVERY_STEP, layout), nproc)
        got = records(run)
        assert [r["step"] for r in got] == list(range(1, BOTH_STEPS + 1))
        for key in PHASE_LOSSES:
            want = torch.tensor([r.get(key, float("nan")) for r in expected[1:]])
            have = torch.tensor([r.get(key, float("nan")) for r in got[1:]])
            torch.testing.assert_close(have, want, rtol=1e-4, atol=0, equal_nan=True)
