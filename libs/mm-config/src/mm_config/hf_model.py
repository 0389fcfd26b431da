"""``model.config`` of transformers models trained through the HF path (``hf_causal_lm`` and app ids)."""

from __future__ import annotations

from typing import Annotated, Any

from .base import ConfigModel
from .known_ids import declare_ids, registered_name
from .registry import register_model_schema

ATTN_IMPLEMENTATIONS = (
    "eager", "flash_attention_2", "flash_attention_3", "flash_attention_4", "flex_attention", "paged|eager", "sdpa",
)  # fmt: skip
"""transformers' attention implementations (``eager`` and ``AttentionInterface``'s, transformers 5.24;
a test in mm-trainer ties them to the installed transformers). A name with a ``/`` is a Hub kernel
repository, which transformers resolves itself."""

AttnImplementation = Annotated[str, registered_name("attn_implementation", accept=lambda name: "/" in name)]
"""A name of :data:`ATTN_IMPLEMENTATIONS` (or one a plugin declares), or a Hub kernel ``org/repo``."""


class HFModelConfig(ConfigModel):
    """How a transformers model class is built and which of its module groups train."""

    architecture: str | None = None
    """transformers class name (``Qwen2_5_VLForConditionalGeneration``); None = the id's own class, else
    ``architectures[0]`` of the source's ``config.json``."""
    attn_implementation: AttnImplementation = "sdpa"
    """transformers attention implementation (``sdpa``, ``eager``, ``flash_attention_2``...)."""
    freeze_groups: list[str] = []
    """Module groups the model class names (e.g. ``vision_tower``, ``multi_modal_projector``,
    ``language_model``) whose parameters get no gradient."""
    hf_config: dict[str, Any] = {}
    """Keys merged into the source's ``config.json`` (nested dicts merge), or the whole config when there
    is no source (e.g. a ``--dry-run`` of a model whose weights are elsewhere)."""


GENERIC_TRANSFORMERS_ID = "hf_causal_lm"
"""The model id of transformers' generic class (mm-trainer's ``HFCausalLM``: ``architecture`` or the
source's ``architectures[0]``). The one way to train a transformers folder without an app's registered
id: an unregistered ``model_id`` is an error, never this class by default."""

register_model_schema(GENERIC_TRANSFORMERS_ID, HFModelConfig)
declare_ids("attn_implementation", *ATTN_IMPLEMENTATIONS)

__all__ = ["ATTN_IMPLEMENTATIONS", "GENERIC_TRANSFORMERS_ID", "HFModelConfig"]
