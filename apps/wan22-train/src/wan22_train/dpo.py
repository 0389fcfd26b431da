"""Wan2.2 Diffusion-DPO (``model.pipeline.dpo``): ``mm_pipelines.DiffusionDPO`` around :class:`Wan22Pipeline`.

Sub-models: the policy ``predictor`` (with ``expert: both`` also ``predictor_low``; it trains, exports and
samples as any Wan predictor) and its reference: the frozen ``reference`` (``reference_low``), or, for a
LoRA policy without one, the policy with its adapters off (no further copy of the weights).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mm_pipelines import REFERENCE_ROLE, DiffusionDPO

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
    """:func:`policy_reference_problems` of a reward fine-tuning ``model.pipeline.<key>`` validated by
    ``options_type`` (``GRPOOptions``, ``NFTOptions``): a reference is needed only with a KL term
    (``kl_weight > 0``); {} when the run has no such key."""
    options = dict(getattr(model_section, "pipeline", None) or {})
    section = options.get(key)
    if section is None:
        return {}
    needs_reference = options_type.model_validate(dict(section)).kl_weight > 0
    return policy_reference_problems(
        model_section, options.get("expert", "all"), mode, needs_reference=needs_reference
    )


def policy_reference_problems(
    model_section: Any, expert: str, mode: str, *, needs_reference: bool = True
) -> dict[str, str]:
    """Why the sub-models cannot train the policy of a fine-tuning ``mode`` against a reference, by sub-model
    name: a policy sub-model missing, a reference that trains, or (``needs_reference``) neither a reference
    nor a LoRA policy (whose base with the adapters off is the reference)."""
    subs = model_section.sub_models()
    problems: dict[str, str] = {}
    for role in policy_roles(expert):
        if role not in subs:
            problems[role] = (
                f"{mode} (expert: {expert}) trains the policy `{role}`: add it under model.models"
            )
    references = reference_roles(expert)
    if any(r in subs for r in references):
        for role in references:
            if role not in subs:
                problems[role] = f"the reference needs `{role}` too (expert: {expert}): add it, frozen"
            elif not subs[role].freeze:
                problems[role] = f"`{role}` is {mode}'s frozen reference: set freeze: true"
        return problems
    if not needs_reference:
        return problems
    for role in policy_roles(expert):
        if role in subs and subs[role].lora is None:
            problems[role] = (
                f"{mode} needs a reference: add the frozen sub-model `{REFERENCE_ROLE}` (the policy's "
                f"starting weights, freeze: true), or train `{role}` as LoRA (a `lora` section), whose base with "
                "the adapters off is the reference"
            )
    return problems
