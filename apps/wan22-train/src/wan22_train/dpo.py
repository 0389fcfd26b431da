"""Wan2.2 Diffusion-DPO (``model.pipeline.dpo``): ``mm_pipelines.DiffusionDPO`` around :class:`Wan22Pipeline`.

Sub-models: the policy ``predictor`` (with ``expert: both`` also ``predictor_low``; it trains, exports and
samples as any Wan predictor) and its reference: the frozen ``reference`` (``reference_low``), or, for a
LoRA policy without one, the policy with its adapters off (no further copy of the weights).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mm_pipelines import REFERENCE_ROLE, DiffusionDPO
from mm_trainer import kl_reference_problems
from mm_trainer import policy_reference_problems as shared_policy_reference_problems

from wan22_train.pipeline import Wan22Pipeline, low_noise_role


def preference_pipeline(base: Wan22Pipeline, options: Mapping[str, Any]) -> DiffusionDPO:
    """Diffusion-DPO on ``base`` from ``model.pipeline.dpo`` (``mm_config.DPOOptions``)."""
    return DiffusionDPO.from_options(base, options)


def policy_roles(expert: str) -> tuple[str, ...]:
    """The policy's sub-models for ``expert``: ``predictor``, and ``predictor_low`` with ``both``."""
    return ("predictor", low_noise_role("predictor")) if expert == "both" else ("predictor",)


def reference_roles(expert: str) -> tuple[str, ...]:
    """The frozen reference's sub-models for ``expert``, when the run has one."""
    return (REFERENCE_ROLE, low_noise_role(REFERENCE_ROLE)) if expert == "both" else (REFERENCE_ROLE,)


def dpo_problems(model_section: Any) -> dict[str, str]:
    """Why the sub-models of a Diffusion-DPO run (``model.pipeline.dpo``) cannot train it, by sub-model name,
    from their config sections alone: a policy sub-model missing, a reference that trains, or neither a
    reference nor a LoRA policy (the policy itself would be its reference: every margin 0)."""
    options = dict(getattr(model_section, "pipeline", None) or {})
    if options.get("dpo") is None:
        return {}
    return policy_reference_problems(model_section, options.get("expert", "all"), "Diffusion-DPO")


def kl_mode_problems(model_section: Any, key: str, options_type: Any, mode: str) -> dict[str, str]:
    """``mm_trainer.kl_reference_problems`` of a Wan reward fine-tuning ``model.pipeline.<key>``, with the
    policy and reference roles of its ``expert``."""
    expert = dict(getattr(model_section, "pipeline", None) or {}).get("expert", "all")
    return kl_reference_problems(model_section, key, options_type, mode, **_roles(expert))


def policy_reference_problems(
    model_section: Any, expert: str, mode: str, *, needs_reference: bool = True
) -> dict[str, str]:
    """``mm_trainer.policy_reference_problems`` with the policy and reference roles of ``expert``."""
    return shared_policy_reference_problems(
        model_section, mode, needs_reference=needs_reference, **_roles(expert)
    )


def _roles(expert: str) -> dict[str, Any]:
    return {"policies": policy_roles(expert), "references": reference_roles(expert), "expert": expert}
