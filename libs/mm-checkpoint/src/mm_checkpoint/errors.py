"""Exception types raised by mm-checkpoint; all name the offending path, key or value."""

from __future__ import annotations

from typing import TypeVar


class CheckpointError(Exception):
    """Base class of every mm-checkpoint error."""


class CheckpointFormatError(CheckpointError, ValueError):
    """A declared format is unknown, or a path holds no checkpoint format we can read."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint directory, iteration or file does not exist or holds no valid checkpoint."""


class AmbiguousCheckpointError(CheckpointError, ValueError):
    """Several valid iterations exist and no tracker file says which one to load."""


class CheckpointLoadError(CheckpointError, RuntimeError):
    """Loading found missing, unexpected or shape-mismatched keys (``strict=True``)."""


class KeyMapError(CheckpointError, ValueError):
    """A key-map table is malformed, cannot be inverted, or is not registered."""


class ContainerCheckpointError(CheckpointFormatError):
    """A checkpoint holds several sub-models (a training run's container, a diffusers pipeline root) and
    the call did not choose one; the message lists them and the known key-map model types."""


EVERY_RANK_ATTRIBUTE = "raised_on_every_rank"
"""Set (true) on an exception raised alike on every rank of a job; the trainer's entry point then lets
rank 0 alone report it (mm-trainer's ``mm_trainer.run.user_errors``)."""

E = TypeVar("E", bound=BaseException)


def raised_on_every_rank(exc: E) -> E:
    """Mark ``exc`` as raised alike on every rank (what :func:`~mm_checkpoint.runtime.on_rank0` and a
    collective checkpoint read raise); returns it."""
    setattr(exc, EVERY_RANK_ATTRIBUTE, True)
    return exc


class CheckpointIntegrityError(CheckpointFormatError):
    """A checkpoint file's bytes are not what its save wrote (a CRC-32 mismatch, a damaged zip): the file
    is corrupted. ``path`` is the file, ``key`` the tensor or record when known, ``iteration`` the
    checkpoint's (set by :meth:`~mm_checkpoint.DistributedCheckpointer.load`)."""

    def __init__(
        self, message: str, *, path: object = None, key: str | None = None, iteration: int | None = None
    ) -> None:
        super().__init__(message)
        self.path, self.key, self.iteration = path, key, iteration

    def __reduce__(self) -> tuple:  # keeps the fields when DCP carries it from another rank
        return (_integrity_error, (str(self), self.path, self.key, self.iteration))


def _integrity_error(
    message: str, path: object, key: str | None, iteration: int | None
) -> CheckpointIntegrityError:
    return CheckpointIntegrityError(message, path=path, key=key, iteration=iteration)
