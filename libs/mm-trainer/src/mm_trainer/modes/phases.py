"""Training phases (``training.phases``): several optimizers over disjoint sub-models, each with its LR
schedule and cadence, stepped in one run (distillation's critic and generator).

The model contract grows by one keyword: a phase's forward is ``model(**batch, rng=..., phase=name)``
and returns that phase's loss; its backward reaches only the phase's own parameters' gradients that
matter (the optimizer of the phase steps those alone, and the others' gradients are dropped). A
checkpoint holds every phase's optimizer (one DCP ``optimizer`` entry over all of them, keyed by
parameter path) and every phase's schedule (``lr_scheduler``: one state per phase, by name), so a
resume restores them all at any layout. A parameter that its phase has not updated yet (the student
of the expert whose timesteps no generator step has drawn so far, a phase that has not run) has no
optimizer state: the checkpoint holds none for it and the resume gives it none
(``mm_checkpoint.DistributedCheckpointer``), as in the uninterrupted run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mm_trainer.model.optim import build_lr_scheduler, build_optimizer
from mm_trainer.run.resume_settings import keep_configured_hyperparameters


@dataclass
class Phase:
    """One training phase: its name, sub-models, optimizer, LR schedule and cadence."""

    name: str
    submodels: tuple[str, ...]
    optimizer: torch.optim.Optimizer
    lr_scheduler: torch.optim.lr_scheduler.LambdaLR
    every: int

    def due(self, step: int) -> bool:
        """Whether the phase updates at optimizer step ``step`` (0-based)."""
        return step % self.every == 0

    @property
    def params(self) -> list[nn.Parameter]:
        """The parameters the phase's optimizer updates."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]


class PhaseSchedulers:
    """The phases' LR schedules as one checkpoint entry: ``{phase name: LambdaLR state}``."""

    def __init__(self, phases: list[Phase]) -> None:
        self.phases = phases

    def state_dict(self) -> dict[str, Any]:
        return {phase.name: phase.lr_scheduler.state_dict() for phase in self.phases}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = [phase.name for phase in self.phases if phase.name not in state]
        if missing:
            raise KeyError(
                f"the checkpoint's lr_scheduler has no state for the phases {missing} (it has {sorted(state)}): "
                "training.phases must name the phases the checkpoint was trained with"
            )
        for phase in self.phases:
            phase.lr_scheduler.load_state_dict(state[phase.name])


def build_phases(model: nn.Module, training: Any, device_type: str) -> list[Phase]:
    """One :class:`Phase` per ``training.phases`` entry, in update order; an unset key of a phase takes
    the ``training`` section's value. A phase's schedule counts its own updates:
    ``ceil(train_iters / every)`` in the run."""
    phases = []
    for name, section in training.phases.items():

        def value(key: str, section: Any = section) -> Any:
            own = getattr(section, key)
            return getattr(training, key) if own is None else own

        lr = value("lr")
        optimizer = build_optimizer(
            model,
            lr=lr,
            betas=(value("adam_beta1"), value("adam_beta2")),
            eps=training.adam_eps,
            weight_decay=value("weight_decay"),
            device_type=device_type,
            only=tuple(section.submodels),
        )
        scheduler = build_lr_scheduler(
            optimizer,
            kind=value("lr_scheduler"),
            warmup=value("lr_warmup_iters"),
            total=-(-training.train_iters // section.every),
            lr=lr,
            min_lr=value("min_lr"),
        )
        phases.append(Phase(name, tuple(section.submodels), optimizer, scheduler, section.every))
    return phases


@contextlib.contextmanager
def keep_configured_phase_hyperparameters(phases: list[Phase]) -> Iterator[None]:
    """:func:`mm_trainer.keep_configured_hyperparameters` for every phase's optimizer and schedule."""
    with contextlib.ExitStack() as stack:
        for phase in phases:
            stack.enter_context(keep_configured_hyperparameters(phase.optimizer, phase.lr_scheduler))
        yield


__all__ = ["Phase", "PhaseSchedulers", "build_phases", "keep_configured_phase_hyperparameters"]
