"""Exception types raised by mm-checkpoint; all name the offending path, key or value."""

from __future__ import annotations


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
