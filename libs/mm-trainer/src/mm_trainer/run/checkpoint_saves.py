"""The checkpoints a run writes: full ones (``training.save``) and model-only ones
(``training.model_save_interval``, into ``<save>/model_only``), synchronous or in the background
(``training.async_save``).

A full checkpoint holds what a resume needs (model, optimizer, scheduler, EMA, data position). A
model-only one holds the model's checkpoint state (the trainable sub-models, or a LoRA sub-model's
adapters) and the EMA: what ``export`` and ``sample`` read, with the run's config beside it, so that
``--checkpoint <save>/model_only`` works as ``--checkpoint <save>`` does. Each series has its own
tracker and retention (``keep_last`` / ``keep_every``; a checkpoint that the retention it was saved under
keeps is deleted only with ``prune_kept``, the command line's ``--prune-kept-checkpoints``); resumes
read the full series only.

Background saves: at most one is in flight over both series (a new save first finishes the one in
flight: when both series save one iteration, the model-only save goes first and the full one waits
for its write, which holds the weights only); :meth:`CheckpointSaves.check` raises a failed write's error at the next step, and
:meth:`CheckpointSaves.finish` (a stop, the end of training) waits for the last one and commits it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from mm_checkpoint import DistributedCheckpointer, Withdrawal, long_waits
from mm_config import TrainConfig, dump_config

from mm_trainer.model.build import log_rank0
from mm_trainer.run.saved_config import RUN_CONFIG_NAME, weight_sources

MODEL_ONLY_DIR = "model_only"
"""Under ``training.save``: the root of the model-only checkpoints (``iter_*`` + tracker + config)."""


class CheckpointSaves:
    """Full and model-only saves of one run (call every method on every rank)."""

    def __init__(
        self,
        config: TrainConfig,
        state: Callable[[], dict[str, Any]],
        *,
        submodels: list[str] | None,
        dp_rank: int,
        dp_size: int,
        rank: int,
        background_group: Any = None,
        prune_kept: bool = False,
    ) -> None:
        training = config.training
        assert training.save is not None
        self.config, self.state, self.submodels, self.rank = config, state, submodels, rank
        self.group = background_group
        self.background = training.async_save
        self.timeout_s = training.long_wait_timeout_s
        self.root = Path(training.save)

        def series(root: Path) -> DistributedCheckpointer:
            return DistributedCheckpointer(
                root, keep_last=training.keep_last, keep_every=training.keep_every,
                dp_rank=dp_rank, dp_size=dp_size, background_group=background_group, prune_kept=prune_kept,
            )  # fmt: skip

        self.full = series(self.root)
        self.model_only = series(self.root / MODEL_ONLY_DIR) if training.model_save_interval else None

    def save(self, iteration: int) -> None:
        """A full checkpoint of ``iteration`` (and the resolved config beside it)."""
        self._save(self.full, self.state(), iteration)

    def save_model(self, iteration: int) -> None:
        """A model-only checkpoint of ``iteration`` (no-op without ``training.model_save_interval``)."""
        if self.model_only is None:
            return
        state = self.state()
        self._save(self.model_only, {"model": state["model"], "ema": state.get("ema")}, iteration)

    def _save(self, series: DistributedCheckpointer, state: dict[str, Any], iteration: int) -> None:
        self.finish()  # at most one save in flight, over both series
        info = {"sources": weight_sources(self.config.model)}  # where an export finds config.json
        reported = series.staging_bytes
        if (
            self.rank == 0
        ):  # before the save commits: a committed checkpoint always has the config it resumes with
            dump_config(self.config, series.root / RUN_CONFIG_NAME)
        series.save(state, iteration, submodels=self.submodels, info=info, background=self.background)
        if self.background and not reported:
            log_rank0(
                f"training.async_save: {series.root} stages {series.staging_bytes / 2**30:.2f} GiB per rank in "
                "host memory (kept for the next save)"
            )

    def withdraw(self, since: int) -> Withdrawal:
        """Stop naming the checkpoints of iteration ``since`` and later (both series) as the latest
        (:meth:`mm_checkpoint.DistributedCheckpointer.withdraw`); the full series' outcome. Every rank."""
        with long_waits(self.group):
            outcomes = [series.withdraw(since) for series in self._series()]
        return outcomes[0]

    def check(self) -> None:
        """Commit a background save whose write has ended; raise its error if it failed (no waiting)."""
        for series in self._series():
            series.check_pending()

    def finish(self) -> None:
        """Wait for the background save in flight (at most ``training.long_wait_timeout_s``) and commit it."""
        for series in self._series():
            series.finish_pending(self.timeout_s)

    @property
    def staging_bytes(self) -> int:
        """Host memory the background saves stage per rank (0 before the first)."""
        return max((s.staging_bytes for s in self._series()), default=0)

    def _series(self) -> list[DistributedCheckpointer]:
        return [s for s in (self.full, self.model_only) if s is not None]
