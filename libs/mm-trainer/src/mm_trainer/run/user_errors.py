"""Errors the user fixes end a command with one clean message and an exit code of their class;
every other exception is a bug and keeps its traceback (:func:`mm_trainer.cli.run` decides).

A user error is an exception whose class, or a base of it, is in :data:`USER_ERRORS`: a config
refused, a lock or export destination taken, a missing or corrupt file, a missing optional package,
Ctrl-C. The classes are named by their dotted path, so that telling an exception's class imports
nothing (``--help`` stays free of torch) and a library's error needs no common base: mm-config,
mm-checkpoint and mm-data raise their own. A plugin adds its own with :func:`register_user_error`.

Which rank prints it: an error every rank raises alike is printed once, by rank 0. That holds for
a class whose :attr:`UserErrorClass.scope` is ``"job"`` (a config is validated alike on every rank)
and for any error marked as raised on every rank (its ``raised_on_every_rank`` attribute: what
mm-checkpoint's ``on_rank0`` raises, such as a held run lock, and what a collective checkpoint read
raises). ``"node"``: every rank of a node sees it (a package missing there, a Ctrl-C on its
terminal): each node's local rank 0 prints it. ``"rank"``: the rank that has it prints it (a data
shard only it reads), with ``[rank N]`` in front when there are several.

``MM_TRAIN_TRACEBACK=1`` (:data:`TRACEBACK_ENV`) prints user errors with their traceback too, with
the same exit codes.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from mm_checkpoint.errors import EVERY_RANK_ATTRIBUTE  # set by mm-checkpoint's raised_on_every_rank

from mm_trainer.run.exit_codes import (
    EXIT_CONFIG,
    EXIT_DEPENDENCY,
    EXIT_DESTINATION,
    EXIT_INPUT,
    EXIT_INTERRUPTED,
    EXIT_REWARD,
)

TRACEBACK_ENV = "MM_TRAIN_TRACEBACK"
"""Set to ``1`` to print user errors with their traceback, as bugs are printed (same exit codes)."""


class UsageError(ValueError):
    """A command's arguments do not fit together or do not fit the run they name (``--expert`` of a
    run with one expert); argparse's own refusals exit 2 the same way."""


@dataclass(frozen=True)
class UserErrorClass:
    """One class of errors the user fixes: its exit code, who prints it, what it covers."""

    name: str
    exit_code: int
    scope: str
    """``"job"``: raised alike on every rank, rank 0 prints it; ``"node"``: alike on every rank of a
    node, each node's local rank 0 prints it; ``"rank"``: the rank that has it prints it."""
    covers: str
    """What it covers, for the README's table."""


CONFIG = UserErrorClass(
    "config", EXIT_CONFIG, "job",
    "the config or command line is refused; a resume whose settings differ from what its checkpoint "
    "trained; a `training.resume` the run directory cannot honour",
)  # fmt: skip
DESTINATION = UserErrorClass(
    "destination", EXIT_DESTINATION, "rank",
    "the run directory is locked by another live run; an export destination holds files no export wrote",
)  # fmt: skip
INPUT = UserErrorClass(
    "input", EXIT_INPUT, "rank",
    "a checkpoint, shard, saved config or data file is missing, unreadable or not what was asked for "
    "(`--ema` of a run without EMA)",
)  # fmt: skip
REWARD = UserErrorClass(
    "reward", EXIT_REWARD, "rank",
    "a reward raised or scored NaN / inf on a sample (`training.reward_failure: stop`)",
)  # fmt: skip
DEPENDENCY = UserErrorClass(
    "dependency", EXIT_DEPENDENCY, "node",
    "an optional package the config or command needs is not installed (peft, transformers, tensorboard, "
    "matplotlib)",
)  # fmt: skip
INTERRUPTED = UserErrorClass(
    "interrupted", EXIT_INTERRUPTED, "node", "Ctrl-C outside the training loop (inside it: a stop, exit 75)"
)
CLASSES: tuple[UserErrorClass, ...] = (CONFIG, DESTINATION, INPUT, REWARD, DEPENDENCY, INTERRUPTED)
"""Every class, in the README's order."""

USER_ERRORS: dict[str, UserErrorClass | None] = {
    "mm_config.errors.ConfigError": CONFIG,
    "mm_trainer.run.user_errors.UsageError": CONFIG,
    "mm_config.errors.RuleViolations": CONFIG,
    "mm_trainer.run.resume_settings.ResumeSettingsError": CONFIG,
    "mm_trainer.run.directory.RunDirectoryError": CONFIG,
    "mm_trainer.run.lock.RunLockedError": DESTINATION,
    "mm_checkpoint.export_dir.ExportDestinationError": DESTINATION,
    "mm_checkpoint.errors.CheckpointError": INPUT,
    "mm_checkpoint.errors.KeyMapError": None,  # a key-map table is malformed: the plugin's bug
    "mm_data.shards.CorruptShardError": INPUT,
    "mm_data.metadata.MetadataError": INPUT,
    "mm_data.bad_samples.BadSampleError": INPUT,
    "mm_data.token_balance.TokenBudgetError": CONFIG,
    "mm_trainer.data.sample_check.SampleFramesError": INPUT,
    "mm_trainer.data.sample_check.PackingError": CONFIG,
    "mm_trainer.checks.model_set.ModelSetError": INPUT,
    "mm_trainer.model.lora.LoraFileError": INPUT,
    "mm_trainer.modes.rewards.RewardError": REWARD,
    "mm_config.errors.MissingDependencyError": DEPENDENCY,
    "builtins.KeyboardInterrupt": INTERRUPTED,
}
"""Dotted class name -> its class of user error; None: a bug, even where a base class is listed. The
most derived listed class of an exception decides."""


def _dotted(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def register_user_error(exception: type[BaseException] | str, kind: UserErrorClass | None) -> None:
    """List ``exception`` (a class, or its dotted name) as a user error of ``kind`` (None: a bug)."""
    USER_ERRORS[exception if isinstance(exception, str) else _dotted(exception)] = kind


def user_error_class(exc: BaseException) -> UserErrorClass | None:
    """The class of user error ``exc`` belongs to, None for a bug."""
    for cls in type(exc).__mro__:
        name = _dotted(cls)
        if name in USER_ERRORS:
            return USER_ERRORS[name]
    return None


@dataclass(frozen=True)
class ProcessPlace:
    """Where this process is in its job (without importing torch)."""

    rank: int
    local_rank: int
    world_size: int

    @classmethod
    def current(cls) -> ProcessPlace:
        """From the initialized default process group if there is one, else the launcher's environment."""
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        else:
            rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        return cls(rank, int(os.environ.get("LOCAL_RANK", str(rank))), world)


def raised_alike_on_every_rank(exc: BaseException, kind: UserErrorClass) -> bool:
    """Whether every rank raised ``exc`` alike: its class says so, or it was marked so."""
    return kind.scope == "job" or bool(getattr(exc, EVERY_RANK_ATTRIBUTE, False))


def prints_here(exc: BaseException, kind: UserErrorClass, place: ProcessPlace) -> bool:
    """Whether this process prints the user error ``exc`` (see the module docstring)."""
    if raised_alike_on_every_rank(exc, kind):
        return place.rank == 0
    if kind.scope == "node":
        return place.local_rank == 0
    return True


def rank_prefix(exc: BaseException, kind: UserErrorClass, place: ProcessPlace) -> str:
    """``[rank N] `` before an error of this rank's (or node's) own in a job of several ranks."""
    return (
        f"[rank {place.rank}] " if place.world_size > 1 and not raised_alike_on_every_rank(exc, kind) else ""
    )


def user_error_message(exc: BaseException, kind: UserErrorClass, prog: str) -> str:
    """The lines a user error prints: ``PROG: error: MESSAGE`` (``PROG: interrupted`` for Ctrl-C)."""
    text = _worker_message(str(exc).strip(), exc)
    if kind is INTERRUPTED:
        return f"{prog}: interrupted" + (f": {text}" if text else "")
    return f"{prog}: error: {text or type(exc).__name__}"


def _worker_message(text: str, exc: BaseException) -> str:
    """A DataLoader worker's error arrives as its traceback inside the message (torch's
    ``ExceptionWrapper``): keep what it raised, and where."""
    head, marker, original = text.partition("Original Traceback (most recent call last):\n")
    if not marker:
        return text
    lines = original.splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith(" ")]
    raised = "\n".join(lines[frames[-1] + 1 :] if frames else lines)
    raised = raised.removeprefix(f"{_dotted(type(exc))}: ")
    return f"{raised} ({head.strip().rstrip('.')})"


def traceback_wanted() -> bool:
    """Whether :data:`TRACEBACK_ENV` asks for tracebacks of user errors."""
    return os.environ.get(TRACEBACK_ENV, "").strip().lower() not in ("", "0", "false", "no")
