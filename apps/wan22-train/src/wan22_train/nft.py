"""Wan2.2 DiffusionNFT (``model.pipeline.nft``): ``mm_pipelines.DiffusionNFT`` around :class:`Wan22Pipeline`.

Sub-models: the policy ``predictor`` (with ``expert: both`` also ``predictor_low``: each rollout step and
each trained sigma runs the expert of its sigma, the old policy's forwards included) and, for the KL term
(``kl_weight > 0``), its reference: the frozen ``reference`` (``reference_low``), or, for a LoRA policy
without one, the policy with its adapters off (no further copy of the weights). The old policy is an EMA of
the trainable parameters (a LoRA policy's adapters only) held by the pipeline. The rollouts are decoded by
the ``ae`` only when a reward scores frames (``Wan22Container.decode_latents``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mm_config import NFTOptions
from mm_pipelines import DiffusionNFT

from wan22_train.dpo import kl_mode_problems
from wan22_train.pipeline import Wan22Pipeline


def nft_pipeline(base: Wan22Pipeline, options: Mapping[str, Any]) -> DiffusionNFT:
    """DiffusionNFT on ``base`` from ``model.pipeline.nft`` (``mm_config.NFTOptions``)."""
    return DiffusionNFT.from_options(base, options)


def nft_problems(model_section: Any) -> dict[str, str]:
    """Why the sub-models of a DiffusionNFT run cannot train it, by sub-model name, from their config sections
    alone: a policy sub-model missing, a reference that trains, or, with a KL term, neither a reference nor
    a LoRA policy."""
    return kl_mode_problems(model_section, "nft", NFTOptions, "DiffusionNFT")
