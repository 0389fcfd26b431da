"""Experiment trackers beside ``metrics.jsonl``: TensorBoard (``training.tensorboard``) and Weights & Biases
(``training.wandb``), each an optional extra imported only when the run asks for it.

A tracker gets what :class:`~mm_trainer.loop.metrics.MetricsLogger` writes to ``metrics.jsonl``: every
record's numbers at its step, as ``train/<key>``, and the validation clips (a video, and audio where the
model samples it) at the step they were drawn. Only rank 0 opens trackers (the logger of the other ranks
is disabled).
"""

from __future__ import annotations

import importlib.util
import logging
import secrets
import string
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
from mm_config import MissingDependencyError

from mm_trainer.run.summary import tensorboard_enabled

__all__ = [
    "TensorBoardTracker",
    "Tracker",
    "WandbTracker",
    "check_tracker_packages",
    "open_trackers",
    "wandb_run_id_path",
]

logger = logging.getLogger("mm_trainer")

WANDB_RUN_ID_NAME = "mm_train_run_id"
"""In ``<log_dir>/wandb``: the id of the W&B run that this log dir's run logs to (a resume continues it)."""


class Tracker(Protocol):
    """What :class:`~mm_trainer.loop.metrics.MetricsLogger` hands every tracker."""

    def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        """The numbers of one ``metrics.jsonl`` record, by key, at optimizer step ``step``."""

    def log_video(self, tag: str, video: torch.Tensor, step: int, path: Path | None) -> None:
        """A clip ``[3, F, H, W]`` in ``[-1, 1]``, also written as the mp4 ``path`` (None: not written)."""

    def log_audio(
        self, tag: str, waveform: torch.Tensor, sample_rate: int, step: int, path: Path | None
    ) -> None:
        """A waveform ``[channels, N]`` in ``[-1, 1]``, also written as the WAV file ``path``."""

    def close(self, failed: bool) -> None:
        """Flush and close (``failed``: the run ends with an error)."""


def _installed(name: str) -> bool:
    if name in sys.modules:
        return sys.modules[name] is not None
    return importlib.util.find_spec(name) is not None


def check_tracker_packages(training: Any) -> None:
    """Before a run builds anything: the packages its trackers need (``training.tensorboard: true``,
    ``training.wandb``) are installed, else a :class:`~mm_config.MissingDependencyError` naming the extra (a user error: exit 69) (nothing is imported here)."""
    if training.tensorboard and not _installed("tensorboard"):
        raise MissingDependencyError(
            "training.tensorboard is on but the tensorboard package is not installed: pip install "
            "'mm-trainer[tensorboard]', or set training.tensorboard: false"
        )
    if getattr(training, "wandb", None) is not None and not _installed("wandb"):
        raise MissingDependencyError(
            "training.wandb is set but the wandb package is not installed: pip install 'mm-trainer[wandb]', "
            "or remove training.wandb"
        )


def _summary_writer_class(setting: bool | None) -> type:
    """torch's ``SummaryWriter``; a clear error naming the extra when tensorboard is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise MissingDependencyError(
            f"training.tensorboard is {'on' if setting else 'unset (on when installed)'} but "
            f"torch.utils.tensorboard cannot import tensorboard ({exc}): pip install "
            "'mm-trainer[tensorboard]', or set training.tensorboard: false"
        ) from exc
    return SummaryWriter


class TensorBoardTracker:
    """Events in ``<log_dir>/tensorboard``; a run that starts at ``start_step`` (a resume) first purges the
    events of later steps (the run writes them again)."""

    def __init__(self, writer_class: type, log_dir: Path, start_step: int) -> None:
        self.writer = writer_class(log_dir=str(log_dir / "tensorboard"), purge_step=start_step + 1)

    def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(f"train/{key}", value, step)

    def log_video(self, tag: str, video: torch.Tensor, step: int, path: Path | None) -> None:
        """The clip's frames as an image strip (``add_video`` would need moviepy)."""
        frames = ((video.detach().float().cpu().transpose(0, 1) + 1) / 2).clamp(0, 1)  # [F, 3, H, W]
        self.writer.add_images(tag, frames, step)

    def log_audio(
        self, tag: str, waveform: torch.Tensor, sample_rate: int, step: int, path: Path | None
    ) -> None:
        """The channels' mean (TensorBoard plays mono)."""
        mono = waveform.detach().float().cpu().mean(dim=0, keepdim=True).clamp(-1, 1)
        self.writer.add_audio(tag, mono, step, sample_rate=sample_rate)

    def close(self, failed: bool) -> None:
        self.writer.close()


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError as exc:
        raise MissingDependencyError(
            f"training.wandb is set but wandb cannot be imported ({exc}): pip install 'mm-trainer[wandb]', "
            "or remove training.wandb"
        ) from exc
    return wandb


def new_run_id() -> str:
    """A fresh W&B run id: 8 lower-case letters and digits, as W&B's own."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


def wandb_run_id_path(log_dir: str | Path) -> Path:
    """Where a run keeps the id of its W&B run: ``<log_dir>/wandb/mm_train_run_id``."""
    return Path(log_dir) / "wandb" / WANDB_RUN_ID_NAME


class WandbTracker:
    """One W&B run (``training.wandb``) with its local files in ``<log_dir>/wandb``.

    The run's id is kept in :func:`wandb_run_id_path`: a run resuming in the same log dir logs to the same
    W&B run (``resume="allow"``). W&B keeps the values it already has for a step: the steps a resumed run
    trains again (those after its last checkpoint) keep their first values there, while ``metrics.jsonl``
    holds the new ones. Videos and audio are logged from the files validation writes (no moviepy needed).
    """

    def __init__(self, section: Any, log_dir: Path, config: Mapping[str, Any] | None) -> None:
        wandb = _import_wandb()
        self._wandb = wandb
        folder = log_dir / "wandb"
        folder.mkdir(parents=True, exist_ok=True)
        id_file = wandb_run_id_path(log_dir)
        run_id = id_file.read_text().strip() if id_file.is_file() else new_run_id()
        self.run = wandb.init(
            project=section.project, entity=section.entity, name=section.name, group=section.group,
            tags=list(section.tags) or None, notes=section.notes, mode=section.mode, dir=str(log_dir),
            id=run_id, resume="allow", config=dict(config) if config is not None else None,
        )  # fmt: skip
        if not id_file.is_file():
            tmp = id_file.with_name(f".{id_file.name}.tmp")
            tmp.write_text(run_id + "\n")
            tmp.replace(id_file)

    def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log({f"train/{key}": value for key, value in scalars.items()}, step=step)

    def log_video(self, tag: str, video: torch.Tensor, step: int, path: Path | None) -> None:
        if path is not None:
            self.run.log({tag: self._wandb.Video(str(path))}, step=step)

    def log_audio(
        self, tag: str, waveform: torch.Tensor, sample_rate: int, step: int, path: Path | None
    ) -> None:
        if path is not None:
            self.run.log({tag: self._wandb.Audio(str(path))}, step=step)

    def close(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def open_trackers(
    *,
    log_dir: Path,
    start_step: int,
    tensorboard: bool | None,
    wandb: Any = None,
    config: Mapping[str, Any] | None = None,
) -> list[Tracker]:
    """The trackers a run asks for: TensorBoard (``tensorboard``: True, or None with the package installed)
    and W&B (``wandb``: the ``training.wandb`` section, or None). A missing package raises MissingDependencyError
    naming its extra before anything is opened."""
    writer = _summary_writer_class(tensorboard) if tensorboard_enabled(tensorboard) else None
    if wandb is not None:
        _import_wandb()
    trackers: list[Tracker] = []
    try:
        if writer is not None:
            trackers.append(TensorBoardTracker(writer, log_dir, start_step))
        if wandb is not None:
            trackers.append(WandbTracker(wandb, log_dir, config))
    except BaseException:
        for tracker in trackers:
            tracker.close(failed=True)
        raise
    return trackers
