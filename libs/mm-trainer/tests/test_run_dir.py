"""Where a run starts (training.resume) given what its save dir and training.load hold."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from mm_checkpoint import DistributedCheckpointer
from mm_trainer.run_dir import RunDirectoryError, open_run_directory, plan_start
from mm_trainer.run_lock import LOCK_FILENAME
from torch import nn


def _run(root: Path, *iterations: int) -> Path:
    for it in iterations:
        DistributedCheckpointer(root).save({"model": nn.Linear(2, 2)}, it)
    return root


def _training(save: Path | None, load: Path | None = None, resume: str = "auto", log_dir=None):
    return SimpleNamespace(save=save and str(save), load=load and str(load), resume=resume, log_dir=log_dir)


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
