"""Diffusion-DPO (Wallace et al. 2023, "Diffusion Model Alignment Using Direct Preference Optimization")
around a flow-match pipeline: a trainable policy (``predictor``) learns from offline pairs, per prompt a
preferred and a rejected clip, against a frozen reference, in the training phase ``dpo``.

The maths, on the base pipeline's own loss: for a clean sample ``x0`` at a grid index ``t`` with noise
``eps``, a model's *denoising error* ``e(x0) = w_t * mean((v(x_t, t) - (eps - x0))^2)`` is the base's
per-sample flow-matching loss (``per_sample_loss``: its timestep weight ``w_t`` included). Both members
of a pair are noised with the same ``t`` and the same ``eps`` (keyed by the pair, ``SampleRNG``), and

    margin = -beta * [(e_policy(x0_w) - e_ref(x0_w)) - (e_policy(x0_l) - e_ref(x0_l))]
    loss   = -log sigmoid(margin)

averaged over the pairs: the policy gains on the preferred clip ``w`` what it loses on the rejected ``l``,
relative to the reference. ``margin`` is the implicit reward margin (the difference of the implicit
rewards ``-beta (e_policy - e_ref)`` of the two members): 0 where the policy is the reference (loss
``log 2``), above 0 once the policy prefers the preferred member more than the reference does. Our
``beta`` absorbs the paper's ``T * omega(lambda_t)`` and the factor 1/2 of its public training script
(whose ``beta_dpo`` 5000 for SD1.5 is ``beta`` 2500 here, on that model's error scale).

The reference: the container's sub-model ``reference`` (frozen) when it has one, else the policy itself
with its LoRA adapters off (``container.adapters_disabled()``: no further copy of the weights). The batch
holds the preferred member under the base pipeline's keys (``video`` / ``latents``, ``prompt`` ...) and the
rejected one's differing keys with the prefix ``rejected_`` (``rejected_video``); the shared keys (the
prompt) are the preferred member's. Logged per step (``PipelineOutput.logged``): ``dpo_margin`` (the
mean implicit reward margin) and ``dpo_accuracy`` (the share of pairs with a margin above 0).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from .keyed_random import SampleRNG
from .pipeline_base import PipelineOutput

REJECTED_PREFIX = "rejected_"
"""Batch keys of a pair's rejected member: ``rejected_<key>``."""
REFERENCE_ROLE = "reference"


def dpo_loss(
    policy_preferred: torch.Tensor, policy_rejected: torch.Tensor, reference_preferred: torch.Tensor,
    reference_rejected: torch.Tensor, beta: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The Diffusion-DPO loss (scalar, the mean over pairs) and each pair's implicit reward margin ``[B]``,
    from the four denoising errors ``[B]`` (module docstring)."""
    margin = -beta * ((policy_preferred - reference_preferred) - (policy_rejected - reference_rejected))
    return -F.logsigmoid(margin).mean(), margin


class DiffusionDPO:
    """Diffusion-DPO on a base pipeline with the stages ``prepare_conditions``, ``noising(conditions, rng,
    indices=None)``, ``predict`` and ``per_sample_loss`` (:class:`~mm_pipelines.FlowMatchT2VPipeline`)."""

    def __init__(self, base: Any, *, beta: float = 2500.0, phase: str = "dpo") -> None:
        if not beta > 0:
            raise ValueError(f"dpo.beta must be > 0, got {beta}")
        self.base, self.beta, self.phase = base, float(beta), phase

    @classmethod
    def from_options(cls, base: Any, options: Mapping[str, Any]) -> DiffusionDPO:
        """From the keys of ``model.pipeline.dpo`` (``mm_config.DPOOptions``) around ``base``."""
        return cls(base, **dict(options))

    @property
    def scheduler(self) -> Any:
        return self.base.scheduler

    # ------------------------------------------------------------------ training
    def forward(
        self, container: Any, rng: SampleRNG | None = None, phase: str | None = None, **batch: Any
    ) -> PipelineOutput:
        """The DPO loss of one micro-batch of pairs, in the phase ``dpo``."""
        if phase != self.phase:
            raise ValueError(
                f"Diffusion-DPO: model(**batch, phase=...) runs in the phase {self.phase!r}; set training.phases: "
                f"{{{self.phase}: {{submodels: [<the policy's sub-models>]}}}} (got phase {phase!r})"
            )
        preferred, rejected = split_pair(batch)
        conditions = [self.base.prepare_conditions(container, member) for member in (preferred, rejected)]
        size = conditions[0]["latents"].shape[0]
        rng = self.base.require_rng(rng, size)
        noised = [self.base.noising(c, rng) for c in conditions]  # one key per pair: the same t and noise
        policy = [self._error(container, n, reference=False) for n in noised]
        with torch.no_grad():
            reference = [self._error(container, n, reference=True) for n in noised]
        loss, margin = dpo_loss(policy[0], policy[1], reference[0], reference[1], self.beta)
        margin = margin.detach()
        logged = {"dpo_margin": float(margin.mean()), "dpo_accuracy": float((margin > 0).float().mean())}
        return PipelineOutput(loss=loss, metrics={"num_samples": float(size)}, logged=logged)

    def __call__(self, container: Any, rng: SampleRNG | None = None, **batch: Any) -> PipelineOutput:
        return self.forward(container, rng, **batch)

    # ------------------------------------------------------------------ held-out pairs
    @torch.no_grad()
    def validation_loss(
        self, container: Any, batch: Mapping[str, Any], rng: SampleRNG, num_timesteps: int
    ) -> torch.Tensor:
        """Per-pair DPO loss ``[B]`` of held-out pairs (``training.validation.data_path`` read by the pairs
        dataset), averaged over ``num_timesteps`` fixed grid indices with the noise keyed by the pair: below
        ``log 2`` on average only when the mean held-out margin is above 0 (``-log sigmoid`` is convex)."""
        preferred, rejected = split_pair(batch)
        conditions = [self.base.prepare_conditions(container, member) for member in (preferred, rejected)]
        size = conditions[0]["latents"].shape[0]
        losses = []
        for index in self.base.scheduler.spaced_indices(num_timesteps).tolist():
            indices = torch.full((size,), index, dtype=torch.long)
            noised = [self.base.noising(c, rng, indices=indices) for c in conditions]
            policy = [self._error(container, n, reference=False) for n in noised]
            reference = [self._error(container, n, reference=True) for n in noised]
            margin = dpo_loss(policy[0], policy[1], reference[0], reference[1], self.beta)[1]
            losses.append(-F.logsigmoid(margin))
        return torch.stack(losses).mean(dim=0)

    # ------------------------------------------------------------------ pieces
    def _error(self, container: Any, noised: dict[str, Any], *, reference: bool) -> torch.Tensor:
        """The denoising error ``[B]`` of the policy, or of the reference."""
        with self._as_reference(container) if reference else contextlib.nullcontext():
            prediction = self.base.predict(container, noised)
        return self.base.per_sample_loss(prediction, noised)

    def _as_reference(self, container: Any) -> contextlib.AbstractContextManager[None]:
        return as_reference(self.base, container, "Diffusion-DPO")


@contextlib.contextmanager
def as_reference(base: Any, container: Any, mode: str) -> Iterator[None]:
    """Inside, ``base``'s predictor is the reference of a reward / preference fine-tuning ``mode``: the
    sub-model ``reference`` through the predictor's code path when the container has one, else the policy
    with its LoRA adapters off (``container.adapters_disabled()``: no further copy of the weights)."""
    if getattr(container, REFERENCE_ROLE, None) is not None:
        with base.acting_as(REFERENCE_ROLE):
            yield
        return
    disable = getattr(container, "adapters_disabled", None)
    if not callable(disable):
        raise TypeError(
            f"{mode} needs a reference: the sub-model {REFERENCE_ROLE!r} (frozen), or a LoRA policy in "
            f"a container with adapters_disabled() ({type(container).__name__} has neither)"
        )
    with disable():
        yield


def split_pair(batch: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A batch of pairs as its preferred and rejected members' batches: the rejected member's keys are
    ``rejected_<key>``; the other keys belong to both (the prompt)."""
    rejected_keys = {k[len(REJECTED_PREFIX) :]: k for k in batch if k.startswith(REJECTED_PREFIX)}
    if not rejected_keys:
        raise KeyError(
            f"Diffusion-DPO needs pairs: the rejected member's keys as {REJECTED_PREFIX}<key> "
            f"(e.g. {REJECTED_PREFIX}video, the video_pairs dataset); the batch has {sorted(batch)}"
        )
    preferred = {k: v for k, v in batch.items() if not k.startswith(REJECTED_PREFIX)}
    rejected = {**preferred, **{key: batch[prefixed] for key, prefixed in rejected_keys.items()}}
    return preferred, rejected


__all__ = ["REFERENCE_ROLE", "REJECTED_PREFIX", "DiffusionDPO", "as_reference", "dpo_loss", "split_pair"]
