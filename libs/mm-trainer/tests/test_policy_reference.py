"""policy_reference_problems / kl_reference_problems: which sub-models a fine-tuning against a reference
needs, from the config's sub-model sections alone."""

from __future__ import annotations

from types import SimpleNamespace

from mm_config import GRPOOptions
from mm_trainer import kl_reference_problems, policy_reference_problems


def _section(pipeline: dict | None = None, **subs: SimpleNamespace) -> SimpleNamespace:
    return SimpleNamespace(pipeline=pipeline or {}, sub_models=lambda: subs)


def _sub(*, freeze: bool = False, lora: object | None = None) -> SimpleNamespace:
    return SimpleNamespace(freeze=freeze, lora=lora)


ROLES = {"policies": ("model",), "references": ("reference",)}


def test_a_full_policy_without_a_reference_is_told_both_ways_out():
    problems = policy_reference_problems(_section(model=_sub()), "DPO", **ROLES)
    assert set(problems) == {"model"}
    assert "add the frozen sub-model `reference`" in problems["model"] and "as LoRA" in problems["model"]


def test_a_lora_policy_or_a_frozen_reference_needs_nothing_more_and_a_training_reference_is_refused():
    assert policy_reference_problems(_section(model=_sub(lora=object())), "DPO", **ROLES) == {}
    assert (
        policy_reference_problems(_section(model=_sub(), reference=_sub(freeze=True)), "DPO", **ROLES) == {}
    )
    problems = policy_reference_problems(_section(model=_sub(), reference=_sub()), "DPO", **ROLES)
    assert problems == {"reference": "`reference` is DPO's frozen reference: set freeze: true"}


def test_a_kl_free_reward_mode_needs_no_reference_and_one_with_a_kl_term_says_it_can_drop_it():
    without_kl = _section({"grpo": {"kl_weight": 0}}, model=_sub())
    assert kl_reference_problems(without_kl, "grpo", GRPOOptions, "Flow-GRPO", **ROLES) == {}
    with_kl = _section({"grpo": {"kl_weight": 0.04}}, model=_sub())
    problems = kl_reference_problems(with_kl, "grpo", GRPOOptions, "Flow-GRPO", **ROLES)
    assert problems["model"].endswith("; or set model.pipeline.grpo.kl_weight: 0 (no KL term)")
    assert kl_reference_problems(_section(model=_sub()), "grpo", GRPOOptions, "Flow-GRPO", **ROLES) == {}
