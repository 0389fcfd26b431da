"""The four-stage generative training pipeline: conditions -> noising -> predict -> loss."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from .container import call_role, get_submodule, is_trainable
from .keyed_random import SampleRNG


@dataclass
class PipelineOutput:
    """What ``container(**batch)`` returns to the trainer.

    Attributes:
        loss: scalar training loss (fp32).
        metrics: per-step numbers for logging, e.g. ``num_tokens`` and ``num_samples``.
        logged: means over the micro-batch that the trainer logs by name, each averaged over the step's
            micro-batches and the data-parallel ranks (Diffusion-DPO's ``dpo_margin``, ``dpo_accuracy``).
    """

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    logged: dict[str, float] = field(default_factory=dict)


class GenerativePipelineBase:
    """A plain orchestrator (not an ``nn.Module``) of four stages.

    It holds no parameters, so module paths, FSDP patterns and checkpoint keys are those of
    the container. Sub-models are looked up on the container by role; ``roles`` maps a role
    to a different attribute name when the container uses other names.

    Subclasses implement ``prepare_conditions``, ``noising``, ``predict`` and
    ``compute_loss``; ``metrics`` is optional. Every random draw goes through ``rng``
    (:class:`~mm_pipelines.SampleRNG`, one per micro-batch from the trainer), so that the loss
    depends on the samples and the step, not on the rank or the layout.
    """

    def __init__(self, *, roles: Mapping[str, str] | None = None) -> None:
        self.roles: dict[str, str] = dict(roles or {})

    # ------------------------------------------------------------------ stages
    def prepare_conditions(self, container: Any, batch: Mapping[str, Any]) -> dict[str, Any]:
        """Encode the batch into clean latents and conditions (no grad for frozen sub-models)."""
        raise NotImplementedError

    def noising(self, conditions: dict[str, Any], rng: SampleRNG | None = None) -> dict[str, Any]:
        """Sample timesteps and noise from ``rng``; return the predictor inputs plus what the loss needs."""
        raise NotImplementedError

    def predict(self, container: Any, noised: dict[str, Any]) -> torch.Tensor:
        """Run the trainable predictor on the noised inputs."""
        raise NotImplementedError

    def compute_loss(self, prediction: torch.Tensor, noised: dict[str, Any]) -> torch.Tensor:
        """Scalar loss of ``prediction`` against the target in ``noised``."""
        raise NotImplementedError

    def metrics(self, container: Any, noised: dict[str, Any]) -> dict[str, float]:
        """Extra numbers for logging (default: none)."""
        return {}

    # ---------------------------------------------------------------- helpers
    def submodule(self, container: Any, role: str) -> torch.nn.Module:
        """The container's sub-model for ``role``."""
        return get_submodule(container, role, self.roles)

    def is_trainable(self, container: Any, role: str) -> bool:
        """Whether the container's sub-model for ``role`` trains."""
        return is_trainable(container, role, self.roles)

    def call(self, container: Any, role: str, *args: Any, method: str = "forward", **kwargs: Any) -> Any:
        """Call a sub-model by role, grad only if trainable (see :func:`call_role`)."""
        return call_role(container, role, *args, roles=self.roles, method=method, **kwargs)

    @contextmanager
    def acting_as(self, role: str) -> Iterator[None]:
        """Inside, the ``predictor`` role runs the sub-model of ``role`` (through ``roles``): a
        distillation's ``teacher`` and ``critic`` take the predictor's code path (conditioning,
        dtype, expert routing)."""
        roles = self.roles
        self.roles = {**roles, "predictor": roles.get(role, role)}
        try:
            yield
        finally:
            self.roles = roles

    def require_rng(self, rng: SampleRNG | None, batch_size: int) -> SampleRNG:
        """``rng``, checked to key exactly ``batch_size`` samples; a drawing stage calls this first."""
        if rng is None:
            raise ValueError(
                f"{type(self).__name__} draws noise and timesteps keyed by sample: pass rng=SampleRNG(...) "
                "(the trainer passes one per micro-batch from the batch's sample_ids; "
                "SampleRNG.for_batch(batch_size) for a stand-alone call)"
            )
        if len(rng) != batch_size:
            raise ValueError(f"rng keys {len(rng)} samples ({rng}) but the batch has {batch_size}")
        return rng

    # ------------------------------------------------------------ orchestration
    def forward(self, container: Any, rng: SampleRNG | None = None, **batch: Any) -> PipelineOutput:
        """Run the four stages on one micro-batch and return the loss and metrics."""
        return self.train_on_conditions(container, self.prepare_conditions(container, batch), rng)

    def train_on_conditions(
        self, container: Any, conditions: dict[str, Any], rng: SampleRNG | None = None
    ) -> PipelineOutput:
        """Stages 2-4 on conditions from :meth:`prepare_conditions` (possibly encoded earlier or by
        another rank: the trainer's ``features.condition_micro_steps``)."""
        noised = self.noising(conditions, rng)
        prediction = self.predict(container, noised)
        loss = self.compute_loss(prediction, noised)
        return PipelineOutput(loss=loss, metrics=self.metrics(container, noised))

    def __call__(self, container: Any, rng: SampleRNG | None = None, **batch: Any) -> PipelineOutput:
        """Same as :meth:`forward` (dispatches to a subclass override)."""
        return self.forward(container, rng, **batch)
