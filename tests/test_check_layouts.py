"""``mm-train check-layouts``: one config at several layouts, the same per-step losses or exit 1.

The command is mm-train's ``main`` called in the test process (``mm_train_in_process``); the runs it
compares are its own subprocesses, one interpreter or torchrun per layout."""

from __future__ import annotations

import pytest
from mm_trainer.checks.layouts import Layout

SECTIONS = {"training": {"global_batch_size": 8, "micro_batch_size": 2, "gradient_accumulation_steps": None}}


@pytest.mark.slow
@pytest.mark.parametrize(("noise", "code"), [("keyed", 0), ("rank_seeded", 1)])
def test_keyed_draws_pass_and_a_rank_seeded_draw_fails(
    toy_yaml, mm_train_in_process, tmp_path, noise: str, code: int
):
    config = toy_yaml(noise, model={"pipeline": {"noise": noise}}, **SECTIONS)
    args = ["--layouts", "1", "2", "--steps", "3", "--work-dir", str(tmp_path / "runs")]
    proc = mm_train_in_process("check-layouts", "--config", str(config), *args)
    assert proc.returncode == code, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["step", "1", "2"] and [line.split()[0] for line in lines[1:4]] == [
        "1",
        "2",
        "3",
    ]
    assert ("OK" if code == 0 else "FAILED") in lines[4]


def test_layouts_that_train_different_global_batches_are_refused_before_running(
    toy_yaml, mm_train_in_process, tmp_path
):
    config = toy_yaml(
        "fixed_accumulation"
    )  # gradient_accumulation_steps: 1, so the global batch follows the world
    args = ["--layouts", "1", "2", "--work-dir", str(tmp_path / "runs")]
    proc = mm_train_in_process("check-layouts", "--config", str(config), *args)
    assert proc.returncode == 2
    assert "different global batches {'1': 4, '2': 8}" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_a_layout_spec_names_its_world_size_and_overrides():
    layout = Layout.parse("4:ulysses=2,micro=1")
    assert layout.world_size == 4
    assert layout.overrides == ("parallel.ulysses_parallel_size=2", "training.micro_batch_size=1")
    with pytest.raises(ValueError, match=r"'ulyses=2' is not key=integer with key one of"):
        Layout.parse("2:ulyses=2")
