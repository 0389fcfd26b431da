"""A checkpoint whose files are being written in the background (``DistributedCheckpointer.save(background=True)``).

The state is staged first, in the caller's thread (:func:`staging_copier`: a copy in host memory,
pinned where an accelerator is present), so the caller may change the model and optimizer as soon as
the save call returns; torch DCP's :func:`~torch.distributed.checkpoint.async_save` then writes the
copy from a thread of its own, with its collectives on a separate process group (gloo), so that they
do not interleave with the training's. :class:`PendingSave` holds the future: once it completes, the
checkpoint is committed (``iter_*.partial`` renamed into place, tracker moved) exactly as a
synchronous save commits it, so a crash at any moment still leaves the previous checkpoint and
tracker intact.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from .errors import CheckpointError


def staging_copier() -> DefaultStager:
    """The stager of a background save: a synchronous copy of the state into host memory, pinned and
    with non-blocking copies where an accelerator is present (none on CPU, where the copy is a memcpy).
    One per checkpointer, so that the pinned buffers of one save serve the next."""
    accelerator = torch.accelerator.is_available()
    return DefaultStager(
        StagingOptions(
            use_pinned_memory=accelerator,
            use_shared_memory=False,
            use_async_staging=False,  # staged when save() returns: training may then change the weights
            use_non_blocking_copy=accelerator,
        )
    )


@dataclass
class PendingSave:
    """One save in flight: its DCP write future and what to do once the files are complete."""

    iteration: int
    partial: Path
    future: Future
    commit: Callable[[], None]
    """Rank 0: write the info file, rename ``partial`` into place, move the tracker, prune; elsewhere a
    no-op. Called once, after :attr:`future` completed without error."""
    discard: Callable[[], None] = lambda: None  # noqa: E731
    """Rank 0: remove ``partial`` (the write failed); elsewhere a no-op. Never raises."""

    def done(self) -> bool:
        """Whether the background write has ended (successfully or not)."""
        return self.future.done()

    def finish(self, timeout_s: float | None = None) -> None:
        """Wait for the write (at most ``timeout_s``), then commit.

        Raises:
            CheckpointError: the background write failed (its error chained: its ``iter_*.partial`` is
                removed) or did not end in time (the write goes on: its ``iter_*.partial`` stays until the
                next save of that iteration); the tracker stays where it was.
        """
        try:
            self.future.result(timeout=timeout_s)
        except FutureTimeout as err:
            raise CheckpointError(
                f"the background save of iteration {self.iteration} into {self.partial} did not end within "
                f"{timeout_s} s. The previous checkpoint and the tracker are unchanged"
            ) from err
        except (Exception, CheckpointException) as err:  # noqa: BLE001 - DCP's is a BaseException
            self.discard()
            raise CheckpointError(
                f"the background save of iteration {self.iteration} into {self.partial} failed: "
                f"{type(err).__name__}: {err}. Its partial files were removed; the previous checkpoint and the "
                "tracker are unchanged"
            ) from err
        self.commit()
