"""``training.wandb``: rank 0's metrics and validation clips in a Weights & Biases run, offline here (no
network), read back with wandb's own reader of the run's ``.wandb`` file (``wandb leet inspect --json``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mm_config import WandbConfig
from mm_data import write_video, write_wav
from mm_trainer import MetricsLogger
from mm_trainer.loop.trackers import wandb_run_id_path

pytest.importorskip("wandb")


def records(run_file: Path) -> list[dict]:
    """Every record of a ``.wandb`` file, as wandb's own reader prints them."""
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_file)],
                         capture_output=True, text=True, check=True, timeout=120)  # fmt: skip
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def offline_runs(log_dir: Path) -> list[Path]:
    """The ``.wandb`` files of the offline runs in ``log_dir``, oldest first."""
    return sorted((log_dir / "wandb").glob("offline-run-*/run-*.wandb"))


def history(run_file: Path) -> dict[int, dict]:
    return {
        r["history"]["step"]["num"]: r["history"]["item"] for r in records(run_file) if r["type"] == "history"
    }


def run_record(run_file: Path) -> dict:
    return next(r["run"] for r in records(run_file) if r["type"] == "run")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def log_steps(log_dir: Path, steps: range, *, start_step: int = 0, **section) -> list[dict]:
    """Log ``loss = 1 / step`` (and ``lr``, ``sample_ids``) for ``steps`` through a W&B MetricsLogger."""
    logger = MetricsLogger(total_steps=10, start_step=start_step, log_dir=log_dir, tensorboard=False,
                           wandb=WandbConfig(**({"project": "mm-train-tests"} | section)), config={"seed": 7})  # fmt: skip
    for step in steps:
        logger.log(
            step, {"loss": torch.tensor(1.0 / step), "lr": 1e-3 * step, "sample_ids": [step, step + 10]}
        )
    logger.close()
    return [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_offline_run_holds_the_numbers_of_every_metrics_record_at_its_step(tmp_path):
    jsonl = log_steps(tmp_path, range(1, 4))
    [run_file] = offline_runs(tmp_path)
    logged = history(run_file)
    assert sorted(logged) == [1, 2, 3]
    for record in jsonl:
        assert logged[record["step"]]["train/loss"] == record["loss"]
        assert logged[record["step"]]["train/lr"] == record["lr"]
        assert "train/sample_ids" not in logged[record["step"]]  # numbers only, as TensorBoard
    assert run_record(run_file)["config"]["update"]["seed"] == 7


def test_every_key_of_the_section_reaches_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")  # mode: offline wins over the environment
    section = dict(project="p1", entity="team", name="lr-sweep-3", group="sweep", tags=["lora", "tiny"],
                   notes="a test run", mode="offline")  # fmt: skip
    log_steps(tmp_path, range(1, 2), **section)
    [run_file] = offline_runs(tmp_path)
    run = run_record(run_file)
    assert (run["project"], run["entity"], run["display_name"], run["run_group"], run["tags"], run["notes"]) == (
        "p1", "team", "lr-sweep-3", "sweep", ["lora", "tiny"], "a test run",
    )  # fmt: skip


def test_a_run_resuming_in_its_log_dir_logs_to_the_same_wandb_run(tmp_path):
    log_steps(tmp_path, range(1, 4))
    run_id = wandb_run_id_path(tmp_path).read_text().strip()
    log_steps(tmp_path, range(3, 5), start_step=2)  # resumed from the step-2 checkpoint
    first, second = offline_runs(tmp_path)
    assert run_record(first)["run_id"] == run_record(second)["run_id"] == run_id
    assert run_record(second)["resume"] is True
    assert sorted(history(second)) == [3, 4]


def test_validation_clips_are_logged_as_video_and_audio_files(tmp_path):
    video, wave = torch.rand(3, 5, 16, 16) * 2 - 1, torch.rand(2, 1600) - 0.5
    mp4 = write_video(video, tmp_path / "validation" / "iter_0000002" / "0.mp4", fps=8)
    wav = write_wav(mp4.with_suffix(".wav"), wave, 16000)
    logger = MetricsLogger(total_steps=4, log_dir=tmp_path, tensorboard=False, wandb=WandbConfig(project="p"))
    logger.add_video("validation/0", video, 2, path=mp4)
    logger.add_audio("validation/0_audio", wave, 16000, 2, path=wav)
    logger.log(2, {"loss": 0.5, "val_loss": 0.25})
    logger.close()
    [run_file] = offline_runs(tmp_path)
    item = history(run_file)[2]
    assert item["train/val_loss"] == 0.25
    assert item["validation/0._type"] == "video-file" and item["validation/0_audio._type"] == "audio-file"
    media = run_file.parent / "files"
    assert (media / item["validation/0.path"]).read_bytes() == mp4.read_bytes()
    assert (media / item["validation/0_audio.path"]).read_bytes() == wav.read_bytes()


def test_a_failed_run_ends_its_wandb_run_with_exit_code_1(tmp_path):
    logger = MetricsLogger(total_steps=4, log_dir=tmp_path, tensorboard=False, wandb=WandbConfig(project="p"))
    logger.log(1, {"loss": 1.0})
    logger.close(failed=True)
    [run_file] = offline_runs(tmp_path)
    assert [r["exit"].get("exit_code") for r in records(run_file) if r["type"] == "exit"] == [1]


def test_without_the_package_the_error_names_the_extra_and_nothing_is_opened(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(ImportError, match=r"training.wandb is set .*pip install 'mm-trainer\[wandb\]'"):
        MetricsLogger(total_steps=1, log_dir=tmp_path, tensorboard=False, wandb=WandbConfig(project="p"))
    assert not (tmp_path / "metrics.jsonl").exists()


def test_a_run_without_the_package_is_refused_before_anything_is_built(monkeypatch):
    from mm_config import TrainingConfig
    from mm_trainer import check_tracker_packages

    training = TrainingConfig(save="runs/x", tensorboard=False, wandb={"project": "p"})
    check_tracker_packages(training)  # installed here
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(ImportError, match=r"training.wandb is set .*pip install 'mm-trainer\[wandb\]'"):
        check_tracker_packages(training)


def test_only_an_enabled_logger_opens_a_run(tmp_path):
    logger = MetricsLogger(total_steps=1, log_dir=tmp_path, wandb=WandbConfig(project="p"), enabled=False)
    logger.log(1, {"loss": 1.0})
    logger.close()
    assert not (tmp_path / "wandb").exists()
