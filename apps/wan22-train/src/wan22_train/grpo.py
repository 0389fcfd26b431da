"""Wan2.2 Flow-GRPO (``model.pipeline.grpo``): ``mm_pipelines.FlowGRPO`` around :class:`Wan22Pipeline`.

Sub-models: the policy ``predictor`` (with ``expert: both`` also ``predictor_low``: each rollout step and
each trained step runs the expert of its sigma) and, for the KL term (``kl_weight > 0``), its reference:
the frozen ``reference`` (``reference_low``), or, for a LoRA policy without one, the policy with its
adapters off (no further copy of the weights). The rollouts are decoded by the ``ae`` only when a reward
scores frames (``Wan22Container.decode_latents``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mm_config import GRPOOptions
from mm_pipelines import FlowGRPO

from wan22_train.dpo import kl_mode_problems
from wan22_train.pipeline import Wan22Pipeline


def grpo_pipeline(base: Wan22Pipeline, options: Mapping[str, Any]) -> FlowGRPO:
    """Flow-GRPO on ``base`` from ``model.pipeline.grpo`` (``mm_config.GRPOOptions``)."""
    return FlowGRPO.from_options(base, options)


def grpo_problems(model_section: Any) -> dict[str, str]:
    """Why the sub-models of a Flow-GRPO run cannot train it, by sub-model name, from their config sections
    alone: a policy sub-model missing, a reference that trains, or, with a KL term, neither a reference nor
    a LoRA policy."""
    return kl_mode_problems(model_section, "grpo", GRPOOptions, "Flow-GRPO")
