"""Tiny Wan2.2 with a fixed global batch of 4 is one run at any layout.

The reference trains 8 steps at world 2 (dp 2) and saves after step 4. Uninterrupted 8-step runs at
world 1, world 2 with Ulysses 2 and world 4 (dp 2 x Ulysses 2) train its losses (rel 1e-4) on the
same samples, and so do runs that resume its step-4 checkpoint at each of those layouts (steps 5-8).
Accumulation is derived per layout (2, 2, 1) from training.global_batch_size.

Every run also validates after steps 4 and 8 (``training.validation``: two prompts sampled in 2
steps at 5x16x16, and ``val_loss`` on 3 held-out clips at 2 fixed timesteps): it writes the clips
and a finite loss at those steps; every other run (dp 1, Ulysses 2, dp 2 x Ulysses 2, and the
resumes; validating after step 8 only, to keep the test short) writes the reference's step-8 clip
files byte for byte and its ``val_loss`` (rel 1e-4).

Each run is ``wan22-train``'s ``main`` on real gloo process groups of forked ranks (the ``main_forked``
fixture): the command line's code path without a fresh interpreter per run.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from mm_data import decode_frames
from wan22_train.cli import main as wan22_main
from wan22_train.configs import config_path
from wan22_train.tiny import make_tiny, tiny_overrides

pytestmark = pytest.mark.slow

LAYOUTS = {"world1": (1, 1), "world2_ulysses2": (2, 2), "world4_dp2_ulysses2": (4, 2)}
VALIDATION_STEPS = (4, 8)
PROMPTS = ("a red square moving left", "a blue circle")


def validation(tiny: Path) -> str:
    """``training.validation``: every 4 steps, two tiny clips and the loss on 3 held-out clips."""
    return (f"training.validation={{interval: 4, prompts: [{', '.join(PROMPTS)}], seeds: [5, 6], num_frames: 5, "
            f"height: 16, width: 16, sampling_steps: 2, fps: 8, loss_timesteps: 2, "
            f"data_path: {tiny / 'data' / 'held_out.json'}}}")  # fmt: skip


def train(main_forked, tiny: Path, log_dir: Path, world: int, ulysses: int, *overrides: str) -> list[dict]:
    """``wan22-train --config tiny_t2v.yaml ...`` (with validation) on ``world`` ranks; returns its metrics records."""
    args = ["--config", str(config_path("tiny_t2v.yaml")), *tiny_overrides(tiny),
            f"parallel.ulysses_parallel_size={ulysses}", "training.global_batch_size=4",
            "training.gradient_accumulation_steps=null", "training.train_iters=8", "training.log_sample_ids=true",
            "training.save=null", f"training.log_dir={log_dir}", validation(tiny), *overrides]  # fmt: skip
    main_forked(wan22_main, args, world, timeout=900)
    return [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]


def write_held_out(tiny: Path) -> None:
    """The first 3 clips of the tiny dataset as the held-out file (3 samples: dp 2 pads a round)."""
    rows = json.loads((tiny / "data" / "metadata.json").read_text())
    (tiny / "data" / "held_out.json").write_text(json.dumps(rows[:3]))


def clips(log_dir: Path, step: int) -> list[Path]:
    return sorted((log_dir / "validation" / f"iter_{step:07d}").glob("*.mp4"))


def frames(clip: Path) -> np.ndarray:
    return decode_frames(clip, list(range(5)), 16, 16)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, main_forked) -> dict:
    """The world-2 (dp 2) run: its records, and its checkpoint after step 4 alone in a folder."""
    root = tmp_path_factory.mktemp("wan_elastic")
    tiny = make_tiny(root / "tiny")
    write_held_out(tiny)
    ckpt = root / "ckpt"
    records = train(main_forked, tiny, ckpt, 2, 1, f"training.save={ckpt}", "training.save_interval=4")
    after_step_4 = root / "after_step_4"
    shutil.copytree(ckpt / "iter_0000004", after_step_4 / "iter_0000004")  # the single valid iter_* dir
    return {"tiny": tiny, "root": root, "records": records, "after_step_4": after_step_4}


def assert_same_steps(records: list[dict], expected: list[dict]) -> None:
    assert [r["step"] for r in records] == [r["step"] for r in expected]
    assert [r["sample_ids"] for r in records] == [r["sample_ids"] for r in expected]
    torch.testing.assert_close(
        torch.tensor([r["loss"] for r in records]),
        torch.tensor([r["loss"] for r in expected]),
        rtol=1e-4,
        atol=0,
    )


def assert_same_step_8_validation(log_dir: Path, records: list[dict], reference: dict) -> None:
    """The run validated after step 8 only, wrote the reference's clip files byte for byte, and
    logged its val_loss (rel 1e-4, as the training losses)."""
    assert [p.name for p in (log_dir / "validation").iterdir()] == ["iter_0000008"]
    ours, theirs = clips(log_dir, 8), clips(reference["root"] / "ckpt", 8)
    assert [c.name for c in ours] == [c.name for c in theirs] == ["0.mp4", "1.mp4"]
    for a, b in zip(ours, theirs, strict=True):
        assert a.read_bytes() == b.read_bytes(), f"{a} differs from {b}"
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    assert [step for step, _ in val] == [8]
    assert val[0][1] == pytest.approx(reference["records"][7]["val_loss"], rel=1e-4)


def test_the_reference_trains_every_sample_once_over_four_epochs(reference):
    records = reference["records"]
    assert [r["step"] for r in records] == list(range(1, 9))
    assert [i for r in records for i in r["sample_ids"]] == list(range(32))  # 8 clips: 2 steps an epoch


def test_the_reference_writes_its_clips_and_a_finite_val_loss_at_every_fourth_step(reference):
    log_dir = reference["root"] / "ckpt"
    assert sorted(p.name for p in (log_dir / "validation").iterdir()) == ["iter_0000004", "iter_0000008"]
    assert all(len(clips(log_dir, step)) == len(PROMPTS) for step in VALIDATION_STEPS)
    first, second = (frames(clip) for clip in clips(log_dir, 8))
    assert first.shape == (5, 16, 16, 3) and first.std() > 1 and not np.array_equal(first, second)
    val = {r["step"]: r["val_loss"] for r in reference["records"] if "val_loss" in r}
    assert list(val) == list(VALIDATION_STEPS) and all(math.isfinite(v) and v > 0 for v in val.values())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_uninterrupted_run_at_another_layout_trains_the_reference_losses(reference, main_forked, layout):
    world, ulysses = LAYOUTS[layout]
    log_dir = reference["root"] / f"whole_{layout}"
    records = train(main_forked, reference["tiny"], log_dir, world, ulysses, "training.validation.interval=8")
    assert_same_steps(records, reference["records"])
    assert_same_step_8_validation(log_dir, records, reference)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_step_4_checkpoint_resumed_at_another_layout_trains_the_reference_steps_5_to_8(
    reference, main_forked, layout
):
    world, ulysses = LAYOUTS[layout]
    load = f"training.load={reference['after_step_4']}"
    log_dir = reference["root"] / f"resumed_{layout}"
    records = train(main_forked, reference["tiny"], log_dir, world, ulysses, load)
    assert_same_steps(records, reference["records"][4:])
    assert_same_step_8_validation(log_dir, records, reference)
