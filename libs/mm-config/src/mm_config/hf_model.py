"""``model.config`` of transformers models trained through the HF path (``hf_causal_lm`` and app ids)."""

from __future__ import annotations

from typing import Any

from .base import ConfigModel
from .registry import register_model_schema


class HFModelConfig(ConfigModel):
    """How a transformers model class is built and which of its module groups train."""

    architecture: str | None = None
    """transformers class name (``Qwen2_5_VLForConditionalGeneration``); None = the id's own class, else
    ``architectures[0]`` of the source's ``config.json``."""
    attn_implementation: str = "sdpa"
    """transformers attention implementation (``sdpa``, ``eager``, ``flash_attention_2``...)."""
    freeze_groups: list[str] = []
    """Module groups the model class names (e.g. ``vision_tower``, ``multi_modal_projector``,
    ``language_model``) whose parameters get no gradient."""
    hf_config: dict[str, Any] = {}
    """Keys merged into the source's ``config.json`` (nested dicts merge), or the whole config when there
    is no source (e.g. a ``--dry-run`` of a model whose weights are elsewhere)."""


register_model_schema("hf_causal_lm", HFModelConfig)

__all__ = ["HFModelConfig"]
