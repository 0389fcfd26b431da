"""Which sub-models a fine-tuning against a reference needs (Diffusion-DPO, Flow-GRPO, DiffusionNFT of any
model plugin), checked from the config's sub-model sections alone, before anything is built: the policy's
sub-models present, a reference present only frozen and whole, and, where the mode needs a reference (DPO
always, GRPO / NFT with a KL term), either that frozen reference or a LoRA policy, whose base with the
adapters off is the reference (no copy of the weights)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def policy_reference_problems(
    model_section: Any,
    mode: str,
    *,
    policies: Sequence[str],
    references: Sequence[str],
    needs_reference: bool = True,
    expert: str | None = None,
    otherwise: str = "",
) -> dict[str, str]:
    """Why the sub-models of ``model_section`` (``model.models``) cannot train ``mode`` (its name in messages),
    by sub-model name: a sub-model of ``policies`` missing, a sub-model of ``references`` that trains (or, of
    several, one missing), or, with ``needs_reference``, no reference and a policy sub-model without LoRA;
    ``expert`` (Wan2.2 A14B's) is named beside the roles it chose; ``otherwise``: a further way out, appended
    to the missing reference's message."""
    subs = model_section.sub_models()
    context = f" (expert: {expert})" if expert is not None else ""
    problems = {
        role: f"{mode}{context} trains the policy `{role}`: add it under model.models"
        for role in policies
        if role not in subs
    }
    if any(role in subs for role in references):
        for role in references:
            if role not in subs:
                problems[role] = f"the reference needs `{role}` too{context}: add it, frozen"
            elif not subs[role].freeze:
                problems[role] = f"`{role}` is {mode}'s frozen reference: set freeze: true"
        return problems
    if needs_reference:
        for role in policies:
            if role in subs and subs[role].lora is None:
                problems[role] = (
                    f"{mode} needs a reference: add the frozen sub-model `{references[0]}` (the policy's "
                    f"starting weights, freeze: true), or train `{role}` as LoRA (a `lora` section), whose base "
                    f"with the adapters off is the reference{otherwise}"
                )
    return problems


def kl_reference_problems(
    model_section: Any, key: str, options_type: Any, mode: str, **roles: Any
) -> dict[str, str]:
    """:func:`policy_reference_problems` of a reward fine-tuning ``model.pipeline.<key>`` validated by
    ``options_type`` (``mm_config.GRPOOptions``, ``NFTOptions``, or a plugin's subclass): a reference is
    needed only with a KL term (``kl_weight > 0``); {} when the run has no such key. ``roles``: the
    ``policies``, ``references`` and ``expert`` of :func:`policy_reference_problems`."""
    section = dict(getattr(model_section, "pipeline", None) or {}).get(key)
    if section is None:
        return {}
    needs_reference = options_type.model_validate(dict(section)).kl_weight > 0
    otherwise = f"; or set model.pipeline.{key}.kl_weight: 0 (no KL term)"
    return policy_reference_problems(
        model_section, mode, needs_reference=needs_reference, otherwise=otherwise, **roles
    )


__all__ = ["kl_reference_problems", "policy_reference_problems"]
