"""Where a run starts (training.resume) given what its save dir and training.load hold."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from mm_checkpoint import DistributedCheckpointer
from mm_trainer.loop.metrics import MetricsLogger
from mm_trainer.run.directory import RunDirectoryError, open_run_directory, plan_start
from mm_trainer.run.lock import LOCK_FILENAME
from torch import nn


def _run(root: Path, *iterations: int) -> Path:
    for it in iterations:
        DistributedCheckpointer(root).save({"model": nn.Linear(2, 2)}, it)
    return root


def _training(save: Path | None, load: Path | None = None, resume: str = "auto", log_dir=None):
    return SimpleNamespace(
        save=save and str(save), load=load and str(load), resume=resume, log_dir=log_dir, lock_lease_s=120.0
    )


@pytest.mark.parametrize("mode", ["auto", "must"])
def test_a_save_dir_holding_a_run_is_resumed_even_with_a_load(tmp_path: Path, mode: str) -> None:
    save = _run(tmp_path / "save", 10)
    assert plan_start(save, _run(tmp_path / "init", 5), mode) == (save, False)


def test_an_empty_save_dir_starts_from_load_or_pretrained(tmp_path: Path) -> None:
    assert plan_start(tmp_path / "save", tmp_path / "init", "auto") == (tmp_path / "init", False)
    assert plan_start(tmp_path / "save", None, "auto") == (None, False)


def test_must_with_nothing_to_resume_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RunDirectoryError, match="resume=must but there is nothing to resume"):
        plan_start(tmp_path / "save", None, "must")


def test_never_with_load_inside_the_save_dir_is_an_error(tmp_path: Path) -> None:
    save = _run(tmp_path / "save", 10)
    with pytest.raises(RunDirectoryError, match="training.load points at it"):
        plan_start(save, save, "never")


def test_never_moves_the_previous_run_aside_whole_and_locks_a_fresh_dir(tmp_path: Path) -> None:
    save = _run(tmp_path / "save", 10, 20)
    (save / "metrics.jsonl").write_text('{"step": 1}\n')
    run_dir = open_run_directory(_training(save, resume="never"))
    (moved,) = tmp_path.glob("save.previous-*")
    assert run_dir.resume_from is None and run_dir.start.moved_aside == moved
    assert sorted(p.name for p in moved.iterdir()) == [
        "iter_0000010", "iter_0000020", "latest_checkpointed_iteration.txt", "metrics.jsonl",
    ]  # fmt: skip
    assert [p.name for p in save.iterdir()] == [LOCK_FILENAME]
    run_dir.release()
    assert not any(save.iterdir())


def test_the_log_dir_is_locked_too(tmp_path: Path) -> None:
    run_dir = open_run_directory(_training(tmp_path / "save", log_dir=str(tmp_path / "logs")))
    assert (tmp_path / "save" / LOCK_FILENAME).is_file() and (tmp_path / "logs" / LOCK_FILENAME).is_file()
    run_dir.release()


def test_never_refuses_a_save_dir_that_holds_no_run_and_moves_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "work"
    (folder / "model").mkdir(parents=True)
    (folder / "data.json").write_text("[]")
    with pytest.raises(
        RunDirectoryError, match=r"holds no run .*it holds data.json, model\): nothing was moved"
    ):
        open_run_directory(_training(folder, resume="never"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]
    assert sorted(p.name for p in folder.iterdir()) == ["data.json", "model"]


def _first_run_logs(tmp_path: Path) -> dict[str, bytes]:
    """A run saving to ``first`` that logged 3 steps into the shared log dir ``logs`` (JSONL + TensorBoard)."""
    run_dir = open_run_directory(_training(tmp_path / "first", log_dir=str(tmp_path / "logs")))
    metrics = MetricsLogger(total_steps=3, log_dir=tmp_path / "logs", tensorboard=True)
    for step in (1, 2, 3):
        metrics.log(step, {"loss": 1.0 / step})
    metrics.close()
    run_dir.release()
    return _tree(tmp_path / "logs")


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_new_run_refuses_a_log_dir_holding_another_runs_metrics_and_truncates_nothing(
    tmp_path: Path,
) -> None:
    first = _first_run_logs(tmp_path)
    with pytest.raises(
        RunDirectoryError, match=f"holds the metrics of the run saving to {tmp_path / 'first'}"
    ):
        open_run_directory(_training(tmp_path / "second", log_dir=str(tmp_path / "logs")))
    assert _tree(tmp_path / "logs") == first


def test_never_moves_another_runs_logs_aside_byte_identical(tmp_path: Path) -> None:
    first = _first_run_logs(tmp_path)
    run_dir = open_run_directory(
        _training(tmp_path / "second", resume="never", log_dir=str(tmp_path / "logs"))
    )
    metrics = MetricsLogger(total_steps=1, log_dir=tmp_path / "logs", tensorboard=True)
    metrics.log(1, {"loss": 9.0})
    metrics.close()
    run_dir.release()
    (moved,) = tmp_path.glob("logs.previous-*")
    assert _tree(moved) == first
    assert [
        json.loads(line)["loss"] for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    ] == [9.0]


def test_the_run_that_wrote_a_log_dir_continues_it(tmp_path: Path) -> None:
    _first_run_logs(tmp_path)
    _run(tmp_path / "first", 2)  # the first run saved iteration 2: running it again resumes it
    run_dir = open_run_directory(_training(tmp_path / "first", log_dir=str(tmp_path / "logs")))
    assert run_dir.resume_from == tmp_path / "first"
    run_dir.release()


def test_logs_from_before_runs_recorded_their_save_dir_are_continued_only_by_a_resume_in_place(
    tmp_path: Path,
) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(RunDirectoryError, match="holds the metrics of another run"):
        open_run_directory(_training(tmp_path / "new", log_dir=str(tmp_path / "logs")))
    run_dir = open_run_directory(_training(_run(tmp_path / "old", 1), log_dir=str(tmp_path / "logs")))
    assert run_dir.resume_from == tmp_path / "old"
    run_dir.release()
