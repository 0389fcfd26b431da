"""The Qwen-VL YAML keys, checked by ``mm-config check`` before anything is built.

Imports only mm-config (no torch), so it is installed as the ``mm_config.schemas`` entry point
``qwen_vl`` and runs on a login node: the ``config`` of the model id ``qwen2_5_vl`` is the generic
transformers-model schema (``mm_config.HFModelConfig``; its ``hf_config`` keys and ``freeze_groups`` are
checked against the model class by mm-trainer's model checks), and the multimodal plugin ``qwen2_vl``
is declared, so the check knows every name the plugin registers.
"""

from __future__ import annotations

from mm_config import HFModelConfig, declare_ids, register_model_schema

register_model_schema("qwen2_5_vl", HFModelConfig)
declare_ids("mm_plugin", "qwen2_vl")
