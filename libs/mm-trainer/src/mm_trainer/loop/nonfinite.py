"""Non-finite steps: skipped with their samples named, capped, and never committed to a checkpoint.

A step whose loss or gradient norm is NaN / inf changes no weight (``training.nonfinite.action:
skip``) and is reported with the samples it trained, so a bad sample can be found. The run stops with
:class:`NonFiniteLossError` at once (``action: stop``), after ``max_consecutive`` skipped steps in a
row, or after more than ``max_skipped`` in all, naming every skipped step's samples.

A checkpoint is a promise that the run can go on from it, so the state after a step may be saved only
when that step's loss and every trainable parameter are finite (:func:`state_is_finite`). While they
are not, no checkpoint is written. Finite is not enough: an lr blow-up first grows the weights to
~1e30 in a step whose loss was still finite (computed before the update), and only the next step's
loss overflows. So when a streak of non-finite steps begins at step ``t`` (1-based), the checkpoints
whose state was that step's input or later (iteration ``t - 1`` and on) are withdrawn: the tracker
moves back to the newest checkpoint before them (``DistributedCheckpointer.withdraw``), and the error
names which to resume and which not. A resume from it with a lower ``training.lr`` then continues
(a changed lr takes effect on resume: ``mm_trainer.run.resume_settings``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

RESUME_ADVICE = (
    "The tracker points at the last checkpoint whose loss and weights were finite and that was not the input of "
    "a non-finite step: resume from it with a lower training.lr (a changed lr takes effect on resume and is logged "
    "as 'changed on resume'), or check those samples (`mm-data check`)"
)


class NonFiniteLossError(RuntimeError):
    """Non-finite steps stopped the run (``training.nonfinite``), or its last state could not be saved."""


@dataclass(frozen=True)
class SkippedStep:
    """One skipped optimizer step (1-based ``step``), its loss and gradient norm, and its samples."""

    step: int
    loss: float
    grad_norm: float
    samples: str


class NonFiniteGuard:
    """Counts skipped steps against ``training.nonfinite`` and raises when a limit is passed.

    ``write`` prints a line (rank 0's metrics console). Every rank keeps the same counts: whether a
    step is finite is decided from the reduced loss and the global gradient norm.
    """

    def __init__(self, policy: Any, write: Any) -> None:
        self.policy, self.write = policy, write
        self.in_a_row = 0
        self.skipped: list[SkippedStep] = []
        self.checkpoints = ""
        """Which checkpoint to resume, which not, since the last streak began (:meth:`streak_begins`)."""

    def streak_begins(self, step: int, withdrawn: str | None) -> None:
        """A streak of non-finite steps begins at step ``step`` (1-based); ``withdrawn`` says which
        checkpoints were withdrawn as its input and which one the tracker names now (None: none was)."""
        self.checkpoints = ""
        if withdrawn is not None:
            self.checkpoints = (
                f"Checkpoints: step {step} is the first non-finite one of its streak, so the checkpoint of its "
                f"input state (iteration {step - 1}) and later ones are withdrawn: {withdrawn}"
            )
            self.write(self.checkpoints)

    def finite_step(self) -> None:
        """A step that updated the weights: the streak ends."""
        self.in_a_row = 0

    def skip(self, step: int, loss: float, grad_norm: float, samples: str) -> None:
        """Record skipped step ``step`` (1-based); raise :class:`NonFiniteLossError` past a limit."""
        self.in_a_row += 1
        self.skipped.append(SkippedStep(step, loss, grad_norm, samples))
        message = (
            f"step {step}: non-finite loss {loss} / grad norm {grad_norm}: step skipped ({self.in_a_row} in a "
            f"row, {len(self.skipped)} in all); its samples: {samples}"
        )
        self.write(message)
        policy = self.policy
        cap = getattr(policy, "max_skipped", None)
        capped = cap is not None and len(self.skipped) > cap
        if policy.action == "stop" or self.in_a_row > policy.max_consecutive or capped:
            checkpoints = f" {self.checkpoints}." if self.checkpoints else ""
            raise NonFiniteLossError(
                f"{message}; stopping (training.nonfinite.action={policy.action}, max_consecutive="
                f"{policy.max_consecutive}, max_skipped={cap}). Skipped steps: "
                f"{self.describe()}.{checkpoints} {RESUME_ADVICE}"
            )

    def describe(self) -> str:
        """Every skipped step with its samples, one after the other."""
        return "; ".join(f"step {s.step}: {s.samples}" for s in self.skipped)


def state_is_finite(loss: float, params: list[torch.Tensor], device: torch.device) -> str | None:
    """None when the state after a step may be committed: its loss finite and every parameter (this
    rank's shards of them) finite on every rank; else what is not.

    Collective: one all-reduce over all ranks, so every rank gives the same answer (call it on all).
    Cheap: one flag per parameter on its device, summed there, and a single device-to-host copy.
    """
    finite = [torch.isfinite(_local(p)).all().to(device) for p in params]
    bad_params = (~torch.stack(finite)).sum().float() if finite else torch.zeros((), device=device)
    flags = torch.stack([torch.tensor(float(not math.isfinite(loss)), device=device), bad_params])
    if dist.is_initialized():
        dist.all_reduce(flags)
    bad_loss, bad = flags.tolist()
    if bad_loss:
        return f"the step's loss is not finite (on this rank: {loss})"
    if bad:
        return f"{int(bad)} parameter shard(s) hold NaN or inf"
    return None


def _local(p: torch.Tensor) -> torch.Tensor:
    """The part of ``p`` this rank holds (a DTensor's local shard)."""
    to_local = getattr(p, "to_local", None)
    return (to_local() if callable(to_local) else p).detach()


__all__ = ["RESUME_ADVICE", "NonFiniteGuard", "NonFiniteLossError", "SkippedStep", "state_is_finite"]
