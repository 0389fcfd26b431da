"""``training.phases``: named training phases, each with its parameters, optimizer, LR schedule and cadence.

A run with phases (distillation: a critic and a generator) makes, at every optimizer step ``s``, one
update of each phase due at ``s`` (``s % every == 0``), in the order the phases are listed; a phase
calls ``model(**batch, phase=<name>)`` on the step's micro-batches and steps its own optimizer over the
parameters of its own sub-models (docs/DESIGN.md "Training phases").
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import ConfigModel, LearningRate


class PhaseConfig(ConfigModel):
    """One phase (``training.phases.<name>``); an unset optimizer or schedule key takes ``training``'s."""

    submodels: list[str] = Field(min_length=1)
    """The trainable sub-models (names from ``model.models``) whose parameters this phase's optimizer
    updates; every trainable sub-model belongs to exactly one phase."""
    every: int = Field(default=1, ge=1)
    """Cadence: the phase updates at the optimizer steps ``s`` with ``s % every == 0`` (0-based). A critic
    with ``every: 1`` and a generator with ``every: 5`` make five critic updates per generator update."""
    lr: LearningRate | None = None
    """Peak learning rate of this phase; None: ``training.lr``."""
    min_lr: float | None = Field(default=None, ge=0)
    """Learning rate at the end of a decay (refused with a ``constant`` schedule, and above the phase's
    ``lr``); None: ``training.min_lr``."""
    lr_scheduler: Literal["constant", "linear", "cosine"] | None = None
    """Shape of the learning rate after warmup; None: ``training.lr_scheduler``."""
    lr_warmup_iters: int | None = Field(default=None, ge=0)
    """Updates of this phase (not optimizer steps) of linear warmup; None: ``training.lr_warmup_iters``."""
    adam_beta1: float | None = Field(default=None, ge=0, lt=1)
    """AdamW beta1 of this phase (DMD2 uses 0 for both its networks); None: ``training.adam_beta1``."""
    adam_beta2: float | None = Field(default=None, ge=0, lt=1)
    """AdamW beta2 of this phase; None: ``training.adam_beta2``."""
    weight_decay: float | None = Field(default=None, ge=0)
    """AdamW weight decay of this phase; None: ``training.weight_decay``."""


__all__ = ["PhaseConfig"]
