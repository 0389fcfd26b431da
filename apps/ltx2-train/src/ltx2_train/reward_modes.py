"""LTX-2 reward fine-tuning (``model.pipeline.grpo`` / ``model.pipeline.nft`` of ``ltx2_container``):
``mm_pipelines.FlowGRPO`` and ``mm_pipelines.DiffusionNFT`` around :class:`~ltx2_train.pipeline.LTX2Pipeline`,
rolling out its video and audio streams together (its flow state).

Sub-models: the policy ``model`` (full or LoRA) and, for the KL term (``kl_weight > 0``), its reference: the
frozen sub-model ``reference``, or, for a LoRA policy without one, the policy with its adapters off (no copy of
the weights). The rollouts' sigma grid is a flow-match grid at ``grpo.shift`` / ``nft.shift`` (required: LTX-2
training draws sigmas from a logit-normal, with no grid of its own). The rewards score the video: its latents
``[N, C, F, H, W]`` (``LTX2Pipeline.scored_latents``) or, for a reward on frames, those decoded by the video VAE
of ``data.dataset.preprocess.model_root`` (``LTX2Container.decode_latents``), and a reward on audio the
audio decoded by the audio VAE and Griffin-Lim (``LTX2Container.decode_audio``).

What the modes do not handle is refused by ``mm-config check`` (``config_schema``): a stream given clean or
frozen (``condition_modality``, ``frozen_modality``), independent audio sigmas, conditioning frames, references,
guidance (no negative text embeddings in the cache), and another training mode beside.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mm_pipelines import DiffusionNFT, FlowGRPO, FlowMatchScheduler
from mm_trainer import kl_reference_problems

from ltx2_train.config_schema import LTX2GRPOOptions, LTX2NFTOptions, whole_clip_problems
from ltx2_train.pipeline import LTX2Pipeline

#: ``model.pipeline`` keys of the reward fine-tunings, and what each builds.
REWARD_MODES = {"grpo": FlowGRPO, "nft": DiffusionNFT}
#: Their option schemas (``model.pipeline.<key>``).
OPTIONS = {"grpo": LTX2GRPOOptions, "nft": LTX2NFTOptions}
POLICY, REFERENCE = "model", "reference"


def reward_mode_pipeline(base: LTX2Pipeline, key: str, options: Mapping[str, Any]) -> FlowGRPO | DiffusionNFT:
    """Flow-GRPO (``key`` ``grpo``) or DiffusionNFT (``nft``) on ``base`` from ``model.pipeline.<key>``
    (``config_schema.LTX2GRPOOptions`` / ``LTX2NFTOptions``): the rollouts' grid at its ``shift``."""
    options = dict(options)
    if options.get("shift") is None:
        raise ValueError(
            f"model.pipeline.{key}.shift is required for LTX-2: the time shift of the rollouts' sigma schedule"
        )
    check_whole_clips(base, f"model.pipeline.{key} (a reward fine-tuning)")
    base.scheduler = FlowMatchScheduler(shift=float(options["shift"]))
    return REWARD_MODES[key].from_options(base, options)


def check_whole_clips(base: LTX2Pipeline, what: str) -> None:
    """Refuse a ``base`` whose options a mode that draws whole clips of both streams from noise cannot use
    (``config_schema.WHOLE_CLIP_KEYS``, which ``mm-config check`` refuses too): ``what`` names the mode."""
    problems = whole_clip_problems(base)
    if problems:
        key, default, why = problems[0]
        raise ValueError(f"model.pipeline.{key}={getattr(base, key)}: {what} {why}: set it to {default}")


def reward_mode_problems(model_section: Any) -> dict[str, str]:
    """Why the sub-models of a reward fine-tuning cannot train it, by sub-model name, from their config
    sections alone (``mm_trainer.kl_reference_problems``: no policy ``model``, a ``reference`` that trains,
    or, with a KL term, neither a ``reference`` nor a LoRA policy); {} for a run of another mode."""
    options = dict(getattr(model_section, "pipeline", None) or {})
    key = next((k for k in REWARD_MODES if options.get(k) is not None), None)
    if key is None:
        return {}
    return kl_reference_problems(
        model_section, key, OPTIONS[key], f"model.pipeline.{key}", policies=(POLICY,), references=(REFERENCE,)
    )


__all__ = ["REWARD_MODES", "check_whole_clips", "reward_mode_pipeline", "reward_mode_problems"]
