"""What a run prints: one plain line per log step without a terminal, and where its files are."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mm_config import TrainingConfig
from mm_trainer.loop.metrics import MetricsLogger, format_log_line
from mm_trainer.run.summary import end_lines, start_lines

RECORD = {"loss": 0.123456, "lr": 1e-4, "grad_norm": 0.5, "step_time_s": 0.25, "samples_per_s": 16.0}


def test_log_line_holds_step_loss_lr_grad_norm_step_time_samples_per_s_and_eta():
    line = format_log_line(10, 40, RECORD, eta_s=3725.4)
    assert line == (
        "step 10/40 | loss 0.1235 | lr 1.000e-04 | grad_norm 0.5 | step_time 0.250s | samples/s 16 | eta 1:02:05"
    )


def test_without_a_terminal_each_log_step_prints_one_plain_line(capsys: pytest.CaptureFixture):
    logger = MetricsLogger(total_steps=4, start_step=0)  # pytest's captured stderr is no terminal
    for step in range(1, 5):
        logger.advance()
        if step % 2 == 0:
            logger.log(step, RECORD)
    logger.close()
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["step 2/4", "step 4/4"]
    assert "\r" not in err and re.search(r"\| eta 0:00:00$", lines[-1])


def _training(tmp_path: Path, **kw) -> TrainingConfig:
    return TrainingConfig(save=str(tmp_path / "ckpt"), train_iters=30, save_interval=10, **kw)


def test_start_lines_name_the_run_directory_checkpoints_and_metrics(tmp_path: Path):
    lines = start_lines(_training(tmp_path, tensorboard=True), resume_from=None, start_iteration=0)
    ckpt = tmp_path / "ckpt"
    assert lines == [
        f"run directory: {ckpt} (new run, 30 iterations)",
        f"checkpoints:   {ckpt / 'iter_*'} (every 10 steps and at iteration 30)",
        f"metrics:       {ckpt / 'metrics.jsonl'} + TensorBoard {ckpt / 'tensorboard'}",
    ]


def test_start_lines_name_the_wandb_project_and_where_its_files_go(tmp_path: Path):
    training = _training(tmp_path, tensorboard=False, wandb={"project": "video-lora", "mode": "offline"})
    lines = start_lines(training, resume_from=None, start_iteration=0)
    ckpt = tmp_path / "ckpt"
    assert (
        lines[2]
        == f"metrics:       {ckpt / 'metrics.jsonl'} + W&B project video-lora (offline; {ckpt / 'wandb'})"
    )


def test_start_lines_say_where_a_resumed_run_continues(tmp_path: Path):
    lines = start_lines(_training(tmp_path), resume_from=tmp_path / "ckpt", start_iteration=20)
    assert (
        lines[0]
        == f"run directory: {tmp_path / 'ckpt'} (resuming {tmp_path / 'ckpt'} at iteration 20, 30 iterations)"
    )


def test_end_lines_name_the_last_checkpoint_written(tmp_path: Path):
    (tmp_path / "ckpt" / "iter_0000030").mkdir(parents=True)
    (tmp_path / "ckpt" / "iter_0000030" / ".metadata").write_bytes(b"")
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("30\n")
    lines = end_lines(_training(tmp_path, log_dir=str(tmp_path / "logs"), tensorboard=False), iteration=30)
    assert lines == [
        f"run directory: {tmp_path / 'ckpt'} (stopped at iteration 30 of 30)",
        f"last checkpoint: {tmp_path / 'ckpt' / 'iter_0000030'}",
        f"metrics:       {tmp_path / 'logs' / 'metrics.jsonl'}",
    ]


def test_end_lines_of_a_failed_run_without_checkpoints(tmp_path: Path):
    lines = end_lines(_training(tmp_path), iteration=None)
    assert lines[:2] == [f"run directory: {tmp_path / 'ckpt'} (failed)", "last checkpoint: none written"]
