"""Where a run writes, said when it starts and when it ends: run directory, checkpoints, metrics.

``mm-train`` (and the apps' train commands) print these lines on rank 0, so a log file or a
terminal always tells where the run's checkpoints and metrics went.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from mm_checkpoint import CheckpointError, latest_iteration
from mm_checkpoint.layout import iteration_dir_name


def tensorboard_enabled(setting: bool | None) -> bool:
    """``training.tensorboard``: true / false as set; None (the default) = whether the ``tensorboard``
    package is installed."""
    return setting if setting is not None else importlib.util.find_spec("tensorboard") is not None


def _metrics_paths(training: Any) -> str:
    log_dir = training.log_dir or training.save
    if not log_dir:
        return "console only (set training.save or training.log_dir for metrics.jsonl)"
    out = str(Path(log_dir) / "metrics.jsonl")
    if tensorboard_enabled(training.tensorboard):
        out += f" + TensorBoard {Path(log_dir) / 'tensorboard'}"
    wandb = getattr(training, "wandb", None)
    if wandb is not None:
        out += f" + W&B project {wandb.project} ({wandb.mode or 'WANDB_MODE, else online'}; {Path(log_dir) / 'wandb'})"
    return out


def start_lines(training: Any, *, resume_from: str | Path | None, start_iteration: int) -> list[str]:
    """Lines for the start of a run: its directory and how it starts, where checkpoints and metrics go.

    ``training`` is the config's ``training`` section (``save``, ``log_dir``, ``save_interval``...).
    """
    run_dir = training.save or training.log_dir
    how = f"resuming {resume_from} at iteration {start_iteration}" if resume_from else "new run"
    every = f"every {training.save_interval} steps and " if training.save_interval else ""
    checkpoints = (
        f"{Path(training.save) / 'iter_*'} ({every}at iteration {training.train_iters})"
        if training.save
        else "none (training.save is not set)"
    )
    return [
        f"run directory: {run_dir or 'none'} ({how}, {training.train_iters} iterations)",
        f"checkpoints:   {checkpoints}",
        f"metrics:       {_metrics_paths(training)}",
    ]


def end_lines(training: Any, *, iteration: int | None) -> list[str]:
    """Lines for the end of a run: where it stopped (None: it failed), its last checkpoint, its metrics."""
    run_dir = training.save or training.log_dir
    state = "failed" if iteration is None else f"stopped at iteration {iteration} of {training.train_iters}"
    try:
        last = latest_iteration(training.save) if training.save else None
    except (
        CheckpointError
    ) as err:  # e.g. several iterations and no tracker: say so, never mask the run's error
        checkpoint = f"unknown ({err})"
    else:
        checkpoint = (
            str(Path(training.save) / iteration_dir_name(last)) if last is not None else "none written"
        )
    return [
        f"run directory: {run_dir or 'none'} ({state})",
        f"last checkpoint: {checkpoint}",
        f"metrics:       {_metrics_paths(training)}",
    ]
